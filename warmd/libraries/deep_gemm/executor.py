"""Runs a plan's DeepGEMM tasks for real on the local GPU, so that DeepGEMM JIT-compiles
exactly the kernel configs the engine will ask for, into the cache root the engine uses.

Each task is one GEMM shape and a list of M values. Inputs are made once per task at the
largest M, the way DeepGEMM's own tests make them (per_token_cast_to_fp8 for activations,
per_block_cast_to_fp8 for weights, UE8M0 scales from sm_100 on), and sliced per M
(``calls.py``; the task's GEMM: ``gemms.py``).

Accounting comes from what DeepGEMM did, not from assumptions. With DG_JIT_PRINT_LOAD_TIME
set (it changes no cache key) DeepGEMM prints "Load time (<entry dir>): ..." each time this
process loads a kernel; the executor captures the process's stdout around every GEMM call,
so each loaded entry belongs to the call that loaded it, whatever other worker processes
write into the same cache dir meanwhile. An entry that was complete before the call is a
local hit, one that was not was compiled by the call. A kernel already loaded by an earlier
task of the same process is reused silently and not reported again (warmup's task records
count it). Should a DeepGEMM build print nothing, the executor falls back to the entries of
the task's GEMM type that appear in cache/ during its calls (exact with one worker):
``accounting.py``.

DeepGEMM is imported as the engine imports it (install.py): an external ``deep_gemm``, else
vLLM's ``vllm.third_party.deep_gemm``, so that what compiles is the very package the engine
runs. torch and DeepGEMM are imported here only, inside methods: the planner never loads
them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile
import time

from warmd import settings
from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.libraries.deep_gemm.accounting import Accounting, StdoutCapture
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.libraries.deep_gemm.calls import caller, make_inputs
from warmd.libraries.deep_gemm.gemms import GemmSpec, gemm_spec
from warmd.tasks import Task

LIBRARY = "deep_gemm"

# When this module was imported, wall clock: the start of a worker's own work.
_IMPORTED_AT = time.time()

# DeepGEMM reads DG_JIT_CACHE_DIR once per process (its compiler is created lazily on the
# first build), so one process can only ever compile into one cache root.
_bound_cache_value: str | None = None


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
            call = caller(self.deep_gemm, spec, inputs)
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
