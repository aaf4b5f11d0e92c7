"""Runs a plan's DeepGEMM tasks for real on the local GPU, so that DeepGEMM JIT-compiles
exactly the kernel configs the engine will ask for, into the cache root the engine uses.

Each task is one GEMM shape and a list of M values. Inputs are made once per task at the
largest M, the way DeepGEMM's own tests make them (per_token_cast_to_fp8 for activations,
per_block_cast_to_fp8 for weights, UE8M0 scales from sm_100 on), and sliced per M.

Accounting comes from what DeepGEMM did, not from assumptions. With DG_JIT_PRINT_LOAD_TIME
set (it changes no cache key) DeepGEMM prints "Load time (<entry dir>): ..." each time this
process loads a kernel; the executor captures the process's stdout around every GEMM call,
so each loaded entry belongs to the call that loaded it, whatever other worker processes
write into the same cache dir meanwhile. An entry that was complete before the call is a
local hit, one that was not was compiled by the call. A kernel already loaded by an earlier
task of the same process is reused silently and not reported again (warmup's task records
count it). Should a DeepGEMM build print nothing, the executor falls back to the entries of
the task's GEMM type that appear in cache/ during its calls (exact with one worker).

DeepGEMM is imported as the engine imports it (install.py): an external ``deep_gemm``, else
vLLM's ``vllm.third_party.deep_gemm``, so that what compiles is the very package the engine
runs. torch and DeepGEMM are imported here only, inside methods: the planner never loads
them.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from warmd import settings
from warmd.cache.base import CacheEntry
from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.tasks import Task

LIBRARY = "deep_gemm"
# Plan kernel name -> (DeepGEMM functions, the first that exists is called; GemmType its
# kernel.cu names).
GEMMS = {
    "fp8_gemm_nt": (("fp8_gemm_nt",), "Normal"),
    "m_grouped_fp8_gemm_nt_contiguous": (("m_grouped_fp8_gemm_nt_contiguous",),
                                         "MGroupedContiguous"),
    # DeepEP low-latency decode (SGLang): every group padded to max M, expected_m per call.
    # DeepGEMM 2.8 dropped the fp8_m_grouped_* spelling sgl-deep-gemm 0.1.x has.
    "m_grouped_fp8_gemm_nt_masked": (("m_grouped_fp8_gemm_nt_masked",
                                      "fp8_m_grouped_gemm_nt_masked"), "MGroupedMasked"),
}
# The contiguous grouped layouts a task can ask for (its spec's "layout"): an expert id per row
# (DeepGEMM's default), or each expert's end row (use_psum_layout=True, DeepGEMM 2.x; vLLM's
# serving on sm90 and sm100). warmd.libraries.deep_gemm.kernels plans them.
LAYOUTS = ("contiguous", "psum")
PSUM_GEMM_TYPE = "MGroupedContiguousWithPsumLayout"  # the GemmType its kernel.cu names
# Elements per chunk when making inputs: bounds the float32 temporaries of the casts.
_CHUNK_ELEMENTS = 1 << 26
_SF_BLOCK = 128

# When this module was imported, wall clock: the start of a worker's own work.
_IMPORTED_AT = time.time()

# DeepGEMM reads DG_JIT_CACHE_DIR once per process (its compiler is created lazily on the
# first build), so one process can only ever compile into one cache root.
_bound_cache_value: str | None = None


@dataclass(frozen=True)
class GemmSpec:
    functions: tuple[str, ...]  # DeepGEMM's names for it, newest first
    gemm_type: str
    n: int
    k: int
    num_groups: int | None
    m: tuple[int, ...]
    layout: str = "contiguous"  # contiguous grouped GEMMs: contiguous | psum
    alignment: int | None = None  # the BLOCK_M cap set around the calls; None: DeepGEMM's own


def gemm_spec(task: Task) -> GemmSpec:
    """The GEMM a task runs; ValueError with the reason when the task is not runnable."""
    if task.library != LIBRARY:
        raise ValueError(f"task {task.key} is a {task.library} task, not a DeepGEMM one")
    if task.kernel not in GEMMS:
        raise ValueError(f"DeepGEMM executor cannot run kernel {task.kernel!r} "
                         f"(known: {', '.join(GEMMS)})")
    functions, gemm_type = GEMMS[task.kernel]
    if not task.n or not task.k or task.n < 1 or task.k < 1:
        raise ValueError(f"task {task.key} has no valid N/K (N={task.n}, K={task.k})")
    if not task.m or min(task.m) < 1:
        raise ValueError(f"task {task.key} has no valid M values")
    groups = None
    if gemm_type in ("MGroupedContiguous", "MGroupedMasked"):
        groups = task.num_groups
        if not groups or groups < 1:
            raise ValueError(f"grouped task {task.key} needs num_groups >= 1")
        if task.n % _SF_BLOCK:
            raise ValueError(f"grouped task {task.key}: N={task.n} is not a multiple of 128")
    layout, alignment = _layout_of(task, gemm_type)
    if layout == "psum":
        gemm_type = PSUM_GEMM_TYPE
    return GemmSpec(functions, gemm_type, task.n, task.k, groups, tuple(sorted(set(task.m))),
                    layout, alignment)


def _layout_of(task: Task, gemm_type: str) -> tuple[str, int | None]:
    spec = task.spec or {}
    layout, alignment = spec.get("layout", "contiguous"), spec.get("alignment")
    if gemm_type != "MGroupedContiguous":
        if "layout" in spec or alignment is not None:
            raise ValueError(f"task {task.key}: a layout or alignment is for contiguous "
                             f"grouped GEMMs only")
        return "contiguous", None
    if layout not in LAYOUTS:
        raise ValueError(f"task {task.key}: unknown grouped layout {layout!r} "
                         f"(known: {', '.join(LAYOUTS)})")
    if alignment is not None and (type(alignment) is not int or alignment < 16
                                  or alignment % 16):
        raise ValueError(f"task {task.key}: alignment must be a positive multiple of 16, "
                         f"got {alignment!r}")
    bad = [m for m in task.m if alignment and m % alignment]
    if bad:
        raise ValueError(f"task {task.key}: grouped GEMM rows must be multiples of the "
                         f"alignment {alignment}; got {bad[:5]}")
    return layout, alignment


def psum_layout_ends(rows: int, groups: int, alignment: int) -> list[int]:
    """A psum grouped layout for `rows` rows: each expert's end row, every expert owning a
    whole number of aligned blocks (spread as evenly as they go), as vLLM's
    deepgemm_moe_permute writes it when every expert's tokens fill their blocks."""
    blocks, ends, end = rows // alignment, [], 0
    base, extra = divmod(blocks, groups)
    for expert in range(groups):
        end += (base + (expert < extra)) * alignment
        ends.append(end)
    return ends


_LOAD_LINE = re.compile(r"^Load time \((?P<path>.+)\): [0-9.]+ ms\s*$")


def loaded_entries(printed: str) -> tuple[list[Path], str]:
    """Entry directories DeepGEMM reported loading, and the rest of what it printed."""
    loads, rest = [], []
    for line in printed.splitlines(keepends=True):
        match = _LOAD_LINE.match(line.strip())
        if match:
            loads.append(Path(match.group("path")))
        else:
            rest.append(line)
    return loads, "".join(rest)


class StdoutCapture:
    """What C/C++ code prints to this process's stdout (fd 1) between start() and stop()."""

    def __init__(self, buffer) -> None:
        self._libc = ctypes.CDLL(None)
        self._file = buffer  # a binary temporary file
        self._saved: int | None = None

    def start(self) -> None:
        sys.stdout.flush()
        self._libc.fflush(None)
        self._saved = os.dup(1)
        os.dup2(self._file.fileno(), 1)

    def stop(self) -> str:
        self._libc.fflush(None)
        if self._saved is not None:
            os.dup2(self._saved, 1)
            os.close(self._saved)
            self._saved = None
        self._file.seek(0)
        data = self._file.read()
        self._file.seek(0)
        self._file.truncate()
        return data.decode(errors="replace")


# Once DeepGEMM printed a load line in this process, its silence means "no load".
_loads_seen = False


@dataclass
class Accounting:
    """Per-task outcomes: loads DeepGEMM reported per call, plus the scan fallback."""

    adapter: DeepGemmCacheAdapter
    spec: GemmSpec
    known: set[str] = field(default_factory=set)  # complete entries of cache/
    outcomes: dict[str, KernelOutcome] = field(default_factory=dict)
    appeared: list[KernelOutcome] = field(default_factory=list)  # fallback: scan of cache/

    def start(self) -> None:
        self.known = set()
        self._refresh()

    def after_call(self, printed: str, seconds: float) -> None:
        """Classify what the call loaded (against the entries complete before it), then
        note what appeared in cache/ during it."""
        global _loads_seen
        loads, rest = loaded_entries(printed)
        if rest:
            os.write(1, rest.encode())  # DeepGEMM's other output stays in the log
        for path in loads:
            _loads_seen = True
            name = path.name
            if name in self.outcomes:
                continue
            # Not complete in cache/ before this call (or loaded from anywhere else, which
            # only a DG_JIT_CACHE_DIR changed behind warmd's back can cause): compiled.
            mine = name not in self.known or path.parent != self.adapter.entries_dir
            self.outcomes[name] = KernelOutcome(name, "compiled" if mine else "local_hit",
                                                round(seconds, 3) if mine else 0.0)
        for name in self._refresh():
            source = self.adapter.source(CacheEntry(LIBRARY, name, self.adapter.entries_dir
                                                    / name))
            # Not another GEMM type's kernel (layout helpers such as transpose_fp32 name
            # no GemmType): count it, as this task's calls may have built it.
            if source is None or source.gemm_type in (None, self.spec.gemm_type):
                self.appeared.append(KernelOutcome(name, "compiled", round(seconds, 3)))

    def _refresh(self) -> list[str]:
        """Entries that became complete since the last look (an incomplete one is looked at
        again next time)."""
        fresh = [name for name in self.adapter.entry_names() - self.known
                 if entry_state(self.adapter.entries_dir / name) == "complete"]
        self.known.update(fresh)
        return sorted(fresh)

    def result(self) -> list[KernelOutcome]:
        return list(self.outcomes.values()) if _loads_seen else list(self.appeared)


class DeepGemmExecutor(Executor):
    library = LIBRARY
    keep_going = False  # True: a failing GEMM call does not end the task's other calls
    fill_inputs = True  # False: inputs of the right shapes, dtypes and layouts, values unset

    def __init__(self, cache_dir=None, device: int | None = None) -> None:
        self._adapter = DeepGemmCacheAdapter(cache_dir)
        self._device = device
        self._checked: tuple[bool, str] | None = None
        self.calls = 0  # GEMM calls made by this executor (benchmarks report it)
        # Wall-clock moments of this process's start-up (the kernel stage reports them).
        self.phases: dict[str, float] = {"imported": _IMPORTED_AT}
        self.call_errors: list[str] = []  # with keep_going: what the failing calls raised
        self.deep_gemm = None  # the DeepGEMM module, once check() imported it

    def cache(self) -> DeepGemmCacheAdapter:
        return self._adapter

    def check(self) -> tuple[bool, str]:
        if self._checked is None:
            self._checked = self._check()
        return self._checked

    def _check(self) -> tuple[bool, str]:
        problems = _environment_problems()
        problems += _gpu_problems(self._device)
        self.phases["torch"] = time.time()
        if problems:
            return False, "; ".join(problems)
        value = str(self._adapter.root)
        if _bound_cache_value is not None and _bound_cache_value != value:
            return False, (f"DeepGEMM in this process already compiles into "
                           f"{_bound_cache_value!r}; it reads DG_JIT_CACHE_DIR once, so "
                           f"{value!r} needs another process")
        from warmd.libraries.deep_gemm.install import resolve

        found = resolve()
        if found is None:  # removed since the probe ran
            return False, "DeepGEMM not installed"
        try:
            self._bind(value)
            self.deep_gemm = importlib.import_module(found.module)
        except Exception as exc:  # ImportError, undefined symbols, CUDA init failures
            return False, f"import {found.module} failed: {_describe(exc)}"
        self.phases["deep_gemm"] = time.time()
        return True, ""

    def _bind(self, value: str) -> None:
        global _bound_cache_value
        os.environ["DG_JIT_CACHE_DIR"] = value
        # Makes DeepGEMM print each kernel it loads; neither flags nor cache keys change.
        os.environ["DG_JIT_PRINT_LOAD_TIME"] = "1"
        _bound_cache_value = value

    def run(self, task: Task) -> TaskResult:
        started = time.monotonic()
        ok, reason = self.check()
        if not ok:
            return _failed(task, started, reason)
        try:
            spec = gemm_spec(task)
        except ValueError as exc:
            return _failed(task, started, str(exc))
        books = Accounting(self._adapter, spec)
        try:
            self._run_gemms(spec, books)
        except Exception as exc:  # OOM, DeepGEMM assertion, nvcc failure: reported
            return _failed(task, started, _describe(exc), books.result())
        if self.call_errors:
            return _failed(task, started, f"{len(self.call_errors)} of {len(spec.m)} GEMM "
                           f"calls failed, first: {self.call_errors[0]}", books.result())
        return TaskResult(task.key, LIBRARY, True, round(time.monotonic() - started, 3),
                          books.result())

    def _run_gemms(self, spec: GemmSpec, books: Accounting) -> None:
        import torch

        device = torch.device("cuda", self._device if self._device is not None
                              else torch.cuda.current_device())
        torch.cuda.set_device(device)
        inputs = None
        try:
            inputs = make_inputs(torch, self.deep_gemm, spec, device, self.fill_inputs)
            call = make_caller(self.deep_gemm, spec, inputs)
            self.phases.setdefault("inputs", time.time())
            books.start()
            self.call_errors = []
            with tempfile.TemporaryFile() as buffer:
                capture = StdoutCapture(buffer)
                for m in spec.m:
                    began = time.perf_counter()
                    capture.start()
                    try:
                        call(m)
                    except Exception as exc:
                        if not self.keep_going:
                            raise
                        self.call_errors.append(f"M={m}: {_describe(exc)}")
                    finally:
                        printed = capture.stop()
                    self.calls += 1
                    books.after_call(printed, time.perf_counter() - began)
            torch.cuda.synchronize(device)
        finally:
            del inputs
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()


class DeepGemmRecorder(DeepGemmExecutor):
    """The discovery pass of the kernel stage (compiler.py): runs a task's GEMMs with
    DeepGEMM's compiler recording instead of compiling, so its kernels run placeholders and
    its results mean nothing; a failing call does not stop the calls after it (each may
    ask for another kernel)."""

    keep_going = True
    # DeepGEMM picks a kernel from shapes, dtypes and layouts, never from values, and the
    # placeholders compute nothing: unfilled inputs save the casts' time before the first
    # kernel is known (the workers' real run still uses real values).
    fill_inputs = False

    def run(self, task: Task) -> TaskResult:
        began = time.time()
        result = super().run(task)
        self._note_timing(task, began)
        return result

    def _note_timing(self, task: Task, began: float) -> None:
        """Append this task's moments to ``<run>/recorders/<pid>.json`` (the run is the
        parent of the throw-away cache root), for the stage's timeline."""
        folder = self._adapter.root.parent / "recorders"
        path = folder / f"{os.getpid()}.json"
        with contextlib.suppress(OSError, ValueError):
            folder.mkdir(exist_ok=True)
            data = json.loads(path.read_text()) if path.is_file() else {"tasks": []}
            data["phases"] = self.phases
            data["tasks"].append({"key": task.key, "began": began, "ended": time.time()})
            path.write_text(json.dumps(data))


def _environment_problems() -> list[str]:
    from warmd.libraries import probe_library

    problems = []
    probe = probe_library("deep_gemm")
    if not probe.available:
        problems.append(probe.reason)
    nvrtc = settings.deep_gemm_key_env().get("DG_JIT_USE_NVRTC")
    if not nvrtc and not (settings.cuda_home() / "bin" / "nvcc").exists():
        problems.append("nvcc not found (DeepGEMM compiles its kernels with it; set CUDA_HOME)")
    return problems


def _gpu_problems(device: int | None) -> list[str]:
    try:
        import torch
    except ImportError:
        return ["torch not installed (DeepGEMM runs through torch)"]
    if not torch.cuda.is_available():
        return ["no CUDA GPU visible (torch.cuda.is_available() is False)"]
    index = device if device is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return [f"GPU {index} not visible ({torch.cuda.device_count()} visible)"]
    major, minor = torch.cuda.get_device_capability(index)
    if major < 9:
        return [f"DeepGEMM needs sm_90 or newer; GPU {index} is sm_{major}{minor}"]
    return []


def make_inputs(torch, deep_gemm, spec: GemmSpec, device, fill: bool = True) -> dict:
    """The GEMM's operands at its largest M, cast the way DeepGEMM's tests cast them; with
    fill False the same tensors (shapes, dtypes, layouts) left unset."""
    casts = importlib.import_module(f"{deep_gemm.__name__}.utils.math")
    per_token_cast_to_fp8, per_block_cast_to_fp8 = (casts.per_token_cast_to_fp8,
                                                    casts.per_block_cast_to_fp8)
    use_ue8m0 = torch.cuda.get_device_capability(device)[0] >= 10
    cast_a, cast_b = (per_token_cast_to_fp8, per_block_cast_to_fp8) if fill else (None, None)
    m_max = max(spec.m)
    if spec.gemm_type == "MGroupedMasked":
        # (groups, max M, K) activations: the masked layout pads every expert to max M.
        rows = spec.num_groups * m_max
        a, sfa = _activations(torch, cast_a, rows, spec.k, device, use_ue8m0)
        a = (a.view(spec.num_groups, m_max, spec.k), sfa.view(spec.num_groups, m_max, -1))
        d = torch.empty((spec.num_groups, m_max, spec.n), dtype=torch.bfloat16, device=device)
        b = _grouped_weights(torch, cast_b, spec, device, use_ue8m0)
        masked = torch.empty(spec.num_groups, dtype=torch.int32, device=device)
        return {"a": a, "b": b, "d": d, "masked_m": masked}
    a = _activations(torch, cast_a, m_max, spec.k, device, use_ue8m0)
    d = torch.empty((m_max, spec.n), dtype=torch.bfloat16, device=device)
    if spec.num_groups is None:
        return {"a": a, "b": _dense_weights(torch, cast_b, spec, device, use_ue8m0), "d": d}
    b = _grouped_weights(torch, cast_b, spec, device, use_ue8m0)
    block = spec.alignment or int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    if spec.layout == "psum":
        # One row of expert end rows per M, all made at once.
        ends = torch.tensor([psum_layout_ends(m, spec.num_groups, block) for m in spec.m],
                            dtype=torch.int32).to(device)
        return {"a": a, "b": b, "d": d, "psum": dict(zip(spec.m, ends.unbind(0), strict=True))}
    # Contiguous layout: every aligned block belongs to one expert, round robin, so any
    # prefix of a multiple of the alignment is a valid layout too.
    blocks = torch.arange(-(-m_max // block), dtype=torch.int32, device=device)
    layout = (blocks % spec.num_groups).repeat_interleave(block)[:m_max].contiguous()
    return {"a": a, "b": b, "d": d, "layout": layout}


def _activations(torch, cast, rows: int, k: int, device, use_ue8m0: bool):
    data = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((rows, -(-k // _SF_BLOCK)), dtype=torch.float32, device=device)
    step = max(_SF_BLOCK, _CHUNK_ELEMENTS // k)
    for start in range(0, rows if cast is not None else 0, step):
        end = min(rows, start + step)
        x = torch.randn((end - start, k), dtype=torch.bfloat16, device=device)
        data[start:end], scales[start:end] = cast(x, use_ue8m0=use_ue8m0)
    return data, scales


def _dense_weights(torch, cast, spec: GemmSpec, device, use_ue8m0: bool):
    """(N, K) FP8 weights and their (N/128, K/128) block scales, as per_block_cast_to_fp8
    makes them (or its tensors unset, without cast)."""
    n, k = spec.n, spec.k
    if cast is not None:
        weights = torch.randn((n, k), dtype=torch.bfloat16, device=device)
        return cast(weights, use_ue8m0=use_ue8m0)
    return (torch.empty((n, k), dtype=torch.float8_e4m3fn, device=device),
            torch.empty((-(-n // _SF_BLOCK), -(-k // _SF_BLOCK)), dtype=torch.float32,
                        device=device))


def _grouped_weights(torch, cast, spec: GemmSpec, device, use_ue8m0: bool):
    g, n, k = spec.num_groups, spec.n, spec.k
    data = torch.empty((g, n, k), dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((g, n // _SF_BLOCK, -(-k // _SF_BLOCK)), dtype=torch.float32,
                         device=device)
    step = max(1, _CHUNK_ELEMENTS // (n * k))
    for start in range(0, g if cast is not None else 0, step):
        end = min(g, start + step)
        x = torch.randn(((end - start) * n, k), dtype=torch.bfloat16, device=device)
        fp8, sf = cast(x, use_ue8m0=use_ue8m0)
        data[start:end] = fp8.view(end - start, n, k)
        scales[start:end] = sf.view(end - start, n // _SF_BLOCK, -1)
    return data, scales


def make_caller(deep_gemm, spec: GemmSpec, inputs: dict) -> Callable[[int], object]:
    """A function of M that calls spec's GEMM on M rows of inputs (make_inputs') as the engine
    calls it (masked grouped: M tokens for every expert)."""
    function = next((getattr(deep_gemm, name) for name in spec.functions
                     if hasattr(deep_gemm, name)), None)
    if function is None:
        raise ValueError(f"{deep_gemm.__name__} has none of {', '.join(spec.functions)}")
    (a, sfa), b, d = inputs["a"], inputs["b"], inputs["d"]
    if spec.num_groups is None:
        return lambda m: function((a[:m], sfa[:m]), b, d[:m])
    if spec.gemm_type == "MGroupedMasked":
        masked_m = inputs["masked_m"]

        def masked_call(m: int):
            # Every expert gets exactly expected_m tokens: the config DeepGEMM picks for it.
            masked_m.fill_(m)
            return function((a, sfa), b, d, masked_m, m)

        return masked_call
    return _contiguous_caller(deep_gemm, function, spec, inputs)


def _contiguous_caller(deep_gemm, function, spec: GemmSpec, inputs: dict):
    """The contiguous grouped GEMM called as vLLM calls it: inside an alignment scope
    (mk_alignment_scope: set_mk_alignment_for_contiguous_layout, restored after), with the
    psum layout when the task asks for it."""
    (a, sfa), b, d = inputs["a"], inputs["b"], inputs["d"]
    alignment = spec.alignment
    if alignment is not None and not hasattr(deep_gemm, "set_mk_alignment_for_contiguous_layout"):
        own = int(deep_gemm.get_mk_alignment_for_contiguous_layout())
        if own != alignment:
            raise ValueError(f"{deep_gemm.__name__} cannot set the alignment {alignment} "
                             f"(its own: {own})")
        alignment = None
    block = alignment or int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    bad = [m for m in spec.m if m % block]
    if bad:
        raise ValueError(f"grouped GEMM rows must be multiples of {block}; got {bad[:5]}")
    if spec.layout == "psum":
        if _accepts(function, "use_psum_layout") is False:
            raise ValueError(f"{deep_gemm.__name__} {function.__name__} has no psum layout "
                             f"(use_psum_layout: DeepGEMM 2.x)")
        ends = inputs["psum"]

        def psum_call(m: int):
            with alignment_scope(deep_gemm, alignment):
                return function((a[:m], sfa[:m]), b, d[:m], ends[m], use_psum_layout=True)

        return psum_call
    layout = inputs["layout"]

    def plain_call(m: int):
        with alignment_scope(deep_gemm, alignment):
            return function((a[:m], sfa[:m]), b, d[:m], layout[:m])

    return plain_call


@contextlib.contextmanager
def alignment_scope(deep_gemm, value: int | None):
    """vLLM's mk_alignment_scope (vllm/utils/deep_gemm.py): DeepGEMM's BLOCK_M cap for
    contiguous grouped GEMMs set to value, and restored afterwards; nothing for None."""
    if value is None:
        yield
        return
    previous = int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    deep_gemm.set_mk_alignment_for_contiguous_layout(value)
    try:
        yield
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(previous)


def _accepts(function, name: str) -> bool | None:
    """Whether function takes the keyword; None when its signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


def _failed(task: Task, started: float, reason: str,
            kernels: list[KernelOutcome] | None = None) -> TaskResult:
    """A failed task: the kernels it compiled before failing, then one failed outcome."""
    seconds = round(time.monotonic() - started, 3)
    failed = KernelOutcome(task.kernel, "failed", seconds)
    return TaskResult(task.key, LIBRARY, False, seconds, [*(kernels or []), failed], reason)
