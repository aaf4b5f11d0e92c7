"""Re-deriving a captured Triton kernel from the library's own kernel function.

A Triton cache entry is named by its key: a hash of the kernel function's source (its
``cache_key``, over the function and every function it calls), the specialisation
(signature, constexpr values, argument attributes), the options and Triton's own code
(``triton.compile``: ``get_cache_key(ASTSource(fn, signature, constexprs, attrs), backend,
options, env)``; the metadata ``<kernel>.json`` holds that hash, the target and the options,
not the signature or the constexprs). A capture contributes parameters only:

- the kernel's name (the metadata's ``name``), looked up as a module-level ``@triton.jit``
  function (an autotuner or heuristics wrapper is followed to it) in this node's own
  installed modules, only those of an allow-list (``WARMD_TRITON_MODULES``, warmd.yaml
  ``capture.triton_modules``; default vLLM's, SGLang's and FlashInfer's packages, those
  importable here). No such function: the kernel is refused and stays local;
- the argument types and 16-divisibility, and the integers and float32 constants its
  frontend IR (``.source``) holds, read as literals from the IR's function header and
  constants (validated, bounded): candidate constexpr values, with small powers of two,
  bools, None and common dtypes (first as the function uses each: a test, a dtype, a
  number);
- the launch options (warps, stages, CTAs, register cap, fp fusion, cooperative launch,
  PDL, debug) and the target arch from the metadata, validated.

The rebuild process (``rebuild.py``, started by ``run_rebuild``: reduced environment,
sandboxed where bubblewrap can) imports the function, searches the specialisations those
literals allow (at most MAX_SPECIALIZATIONS keys, each a hash, nothing compiled) for the one
whose key is the capture's, and compiles ``ASTSource(fn=<this node's function>, …)`` with it:
never the capture's IR or source. No specialisation of this node's function gives the capture's
key: the capture's code is not the library's (tampering, or another version), and it is
quarantined (``RederiveMismatch``). The re-derived entry is what this node's Triton wrote
for that key, every stage and the metadata.

Measured (tests/capture/test_capture_rederive.py, scripts/bench/bench_triton_rederive.py,
triton 3.9, sm_90 on a CPU machine): this node's compile reproduces the engine's entry byte
for byte (FlashInfer's own rms_norm_kernel, found through the default allow-list, among
them) when it sees the engine's Triton tool knobs (importing FlashInfer sets
TRITON_PTXAS_BLACKWELL_PATH, which changes the cubin: this node's own knobs are kept).

Not re-derived (stays local): host modules (``cuda_utils``, launchers: one ``.so``, no
source), kernels defined outside the allow-listed modules or not at module level (Inductor's
generated kernels among them), argument types warmd does not map (tuples, tensor
descriptors), and kernels with more specialisations to search than MAX_SPECIALIZATIONS
(many constexprs). A constexpr value the candidates cannot name (a float, a string, an
integer the IR folded away) makes a genuine kernel look like other code: quarantined.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import struct
import sys
from pathlib import Path

from warmd.cache.base import CacheEntry
from warmd.cache.install import unpack_safely
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveMismatch,
    RederiveRefused,
    run_rebuild,
)
from warmd.cache.safe_fs import CacheTree, load_json
from warmd.context import NodeContext
from warmd.libraries.triton.cache import (
    ENTRY_RE,
    GROUP_RE,
    MAX_GROUP_BYTES,
    TritonCacheAdapter,
    host_module,
)
from warmd.libraries.triton.rebuild import entry_name

KERNEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
STAGES = ("source", "ttir", "ttgir", "llir", "ptx", "cubin")  # what Triton writes, all rebuilt
MAX_ARGS = 128  # a kernel's parameters
MAX_INTS = 48  # distinct integers of the IR tried as constexpr values
MAX_FLOATS = 8  # distinct float32 constants of the IR tried as constexpr values
# Launch parameters a kernel's options may carry, with what each may be.
_OPTIONS = {
    "num_warps": lambda v: isinstance(v, int) and v in (1, 2, 4, 8, 16, 32),
    "num_ctas": lambda v: isinstance(v, int) and 1 <= v <= 16,
    "num_stages": lambda v: isinstance(v, int) and 0 <= v <= 16,
    "maxnreg": lambda v: v is None or (isinstance(v, int) and 16 <= v <= 255),
    "enable_fp_fusion": lambda v: isinstance(v, bool),
    "launch_cooperative_grid": lambda v: isinstance(v, bool),
    "launch_pdl": lambda v: isinstance(v, bool),
    "debug": lambda v: isinstance(v, bool),
}
_ENV = re.compile(r"^TRITON_[A-Z0-9_]{1,64}$")
_LIBRARY_CACHES = ("FLASHINFER_WORKSPACE_BASE", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME")
# Knobs that dump, override or relocate what Triton reads and writes: never in a rebuild
# (this node's tool paths, TRITON_PTXAS_*_PATH among them, are kept: they shape the cubin).
_UNSAFE_ENV = re.compile(r"^TRITON_(CACHE|HOME|DUMP|OVERRIDE|KERNEL_DUMP|KERNEL_OVERRIDE|"
                         r"ALWAYS_COMPILE|INTERPRET|STORE_BINARY_ONLY)")
# IR element types -> the signature types Triton's specialisation gives them
_ELEMENT = {"i1": ("i1",), "i8": ("i8", "u8"), "i16": ("i16",), "i32": ("i32",),
            "i64": ("i64", "u64"), "f16": ("fp16",), "bf16": ("bf16",), "f32": ("fp32",),
            "f64": ("fp64",), "f8E4M3FN": ("fp8e4nv",), "f8E5M2": ("fp8e5",),
            "f8E4M3FNUZ": ("fp8e4b8",), "f8E5M2FNUZ": ("fp8e5b16",)}
_SCALAR = {"i1": ("i1",), "i32": ("i32",), "i64": ("i64", "u64"), "f32": ("fp32",),
           "f64": ("fp64",), "f16": ("fp16",), "bf16": ("bf16",)}
_ARG = re.compile(r"%([A-Za-z_][A-Za-z0-9_]{0,127}): (!tt\.ptr<([A-Za-z0-9]+)>|[a-z0-9]+)"
                  r"( \{tt\.divisibility = 16 : i32\})?(?= loc|,|\))")
_MODULE = re.compile(r"^[A-Za-z_]\w{0,63}(\.[A-Za-z_]\w{0,63}){0,7}$")
_FLOAT = re.compile(r"arith\.constant (-?\d\.\d{1,20}[eE][-+]?\d{1,3}) : f32\b")
_INT = re.compile(r"(?<![\w.%#])(-?\d{1,10})(?=\s*:\s*i(?:32|64)\b|x|>|\s*:\s*i32,)")


def rederive(adapter: TritonCacheAdapter, name: str, artifact: bytes,
             scratch: Path, context: NodeContext | None = None) -> Rederived:
    """``context``: the producer's (its Triton modules, its variables; default: this
    process's environment)."""
    context = context or NodeContext.of()
    if not ENTRY_RE.match(name):
        raise RederiveRefused(f"not a Triton cache entry name: {name!r}")
    capture = scratch / "capture" / name
    unpack_safely(artifact, capture)
    tree = CacheTree(capture.parent)
    if host_module(tree, name) is not None:
        raise RederiveRefused("a Triton host module (launcher, cuda_utils) records no "
                              "source to rebuild it from")
    kernel, files = _kernel_files(tree, name)
    meta = _metadata(tree, name, kernel)
    if importlib.util.find_spec("triton") is None:
        raise CannotRederiveHere("Triton is not installed here")
    args, ints = _parameters(tree.read(f"{name}/{kernel}.source").data, kernel)
    out = scratch / "rebuilt"
    out.mkdir(parents=True)
    job = scratch / "job.json"
    job.write_text(json.dumps({
        "kernel": kernel, "hash": meta["hash"], "arch": _arch(meta),
        "options": _options(meta), "args": args, "ints": ints,
        "modules": [m for m in context.triton_modules if _MODULE.match(m)]}))
    run_rebuild([sys.executable, "-m", "warmd.libraries.triton.rebuild", str(job), str(out)],
                env=_rebuild_env(meta, scratch / "triton-cache", context),
                cwd=str(scratch))
    _outcome(out, kernel)
    return _entry(adapter, name, kernel, out, capture, files, artifact, scratch / "entry")


def _outcome(out: Path, kernel: str) -> None:
    """What the rebuild process found: RederiveRefused when no allow-listed function has
    the kernel's name, RederiveMismatch when none of its specialisations has the key."""
    result = load_json((out / "result.json").read_bytes(), 4096, "result.json")
    outcome = result.get("outcome") if isinstance(result, dict) else None
    why = str(result.get("why", ""))[:300] if isinstance(result, dict) else ""
    if outcome == "built":
        return
    if outcome == "mismatch":
        raise RederiveMismatch(f"no specialisation of this node's {kernel} has the capture's "
                               f"key: {why}")
    raise RederiveRefused(f"{why or 'the rebuild made nothing'}: {kernel} stays local to "
                          "the node that built it")


def _entry(adapter: TritonCacheAdapter, name: str, kernel: str, out: Path, capture: Path,
           files: list[str], artifact: bytes, entry_root: Path) -> Rederived:
    """The entry as this node's Triton wrote it (the group file with bare names)."""
    entry = entry_root / name
    entry.mkdir(parents=True)
    built = sorted(p.name for p in out.iterdir() if p.name != "result.json")
    if f"{kernel}.cubin" not in built or f"{kernel}.json" not in built:
        raise RederiveRefused(f"the rebuild of {kernel} wrote no cubin")
    for child in built:
        (entry / child).write_bytes((out / child).read_bytes())
    (entry / f"__grp__{kernel}.json").write_text(json.dumps(
        {"child_paths": {child: str(entry / child) for child in built}}))
    packed = TritonCacheAdapter(entry_root, adapter.arch).pack(
        CacheEntry(adapter.library, name, entry))
    differs = tuple(child for child in sorted(set(files) | set(built))
                    if not (capture / child).is_file() or not (entry / child).is_file()
                    or (entry / child).read_bytes() != (capture / child).read_bytes())
    return Rederived(packed, packed == artifact, differs)


def _kernel_files(tree: CacheTree, name: str) -> tuple[str, list[str]]:
    """The kernel's name and the files its one group lists (its frontend IR and metadata
    among them, nothing else than Triton's stages)."""
    groups = [g for g in tree.listdir(name) if GROUP_RE.match(g)]
    if len(groups) != 1:
        raise RederiveRefused(f"a Triton kernel entry has one group file, not {len(groups)}")
    kernel = groups[0][len("__grp__"):-len(".json")]
    if not KERNEL_RE.match(kernel):
        raise RederiveRefused(f"not a Triton kernel name: {kernel!r}")
    data = tree.read_json(f"{name}/{groups[0]}", MAX_GROUP_BYTES)
    children = data.get("child_paths") if isinstance(data, dict) else None
    allowed = {f"{kernel}.{ext}" for ext in (*STAGES, "json")}
    if not isinstance(children, dict) or not set(children) <= allowed:
        raise RederiveRefused(f"the group of {kernel} lists files Triton does not write")
    needed = {f"{kernel}.source", f"{kernel}.json"}
    if not needed <= set(children):
        raise RederiveRefused(f"the entry lacks {sorted(needed - set(children))}: no "
                              "parameters to rebuild from")
    return kernel, sorted(children)


def _metadata(tree: CacheTree, name: str, kernel: str) -> dict:
    meta = load_json(tree.read(f"{name}/{kernel}.json").data, MAX_GROUP_BYTES,
                     f"{name}/{kernel}.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("hash"), str) \
            or not re.fullmatch(r"[0-9a-f]{64}", meta["hash"]):
        raise RederiveRefused(f"the metadata of {kernel} holds no key hash")
    if entry_name(meta["hash"]) != name:
        raise RederiveRefused(f"the metadata's key is not the entry's name {name}")
    if meta.get("name") != kernel:
        raise RederiveRefused(f"the metadata names another kernel than {kernel}")
    return meta


def _parameters(source: bytes, kernel: str) -> tuple[list[dict], list[int | float]]:
    """From the frontend IR, as literals: each runtime argument's name, the signature
    types it may have and whether it was specialised as 16-divisible; the integers and
    float32 constants the IR holds (candidate constexpr values). Nothing else of the IR is
    used."""
    text = source.decode(errors="replace")
    head = re.search(rf"^\s*tt\.func (?:public )?@{kernel}\((.*)\)(?: attributes|\s*\{{)",
                     text, re.M)
    if head is None:
        raise RederiveRefused(f"the frontend IR of {kernel} has no function header")
    args = []
    for arg_name, kind, element, div in _ARG.findall(head.group(1)):
        types = (tuple(f"*{t}" for t in _ELEMENT.get(element, ())) if element
                 else _SCALAR.get(kind, ()))
        if not types:
            raise RederiveRefused(f"argument {arg_name} of {kernel} has a type warmd does "
                                  f"not re-derive ({kind})")
        args.append({"name": arg_name, "types": list(types), "div": bool(div)})
    if len(args) != head.group(1).count("%") or len(args) > MAX_ARGS:
        raise RederiveRefused(f"the arguments of {kernel} are not plain scalars and pointers")
    ints = sorted({int(v) for v in _INT.findall(text) if abs(int(v)) < 1 << 31},
                  key=lambda v: (abs(v), v))
    floats = sorted({_shortest_f32(float(v)) for v in _FLOAT.findall(text)
                     if math.isfinite(float(v))}, key=abs)
    return args, ints[:MAX_INTS] + floats[:MAX_FLOATS]


def _shortest_f32(value: float) -> float:
    """The shortest decimal a float32 constant of the IR was written as (1e-06 for
    9.99999997E-7): the Python float a constexpr held."""
    single = struct.pack("f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("f", candidate) == single:
            return candidate
    return value


def _arch(meta: dict) -> int:
    """The CUDA arch the kernel was compiled for (its metadata's target)."""
    target = meta.get("target")
    if not isinstance(target, dict) or target.get("backend") != "cuda" \
            or target.get("warp_size") != 32 or not isinstance(target.get("arch"), int) \
            or isinstance(target.get("arch"), bool) or not 70 <= target["arch"] <= 130:
        raise RederiveRefused("the metadata's target is not a CUDA GPU")
    return target["arch"]


def _options(meta: dict) -> dict:
    options = {}
    for key, ok in _OPTIONS.items():
        if key in meta:
            if not ok(meta[key]):
                raise RederiveRefused(f"option {key}={meta[key]!r} is not one Triton's "
                                      "launch parameters give")
            options[key] = meta[key]
    return options


def _rebuild_env(meta: dict, cache: Path, context: NodeContext) -> dict[str, str]:
    """This node's environment (this node's own Triton knobs too: line info, for one,
    is not in a kernel's metadata and changes its cubin), the capture's cache-invalidating
    knobs (as Triton records them: short strings) over it, and a scratch cache (the
    libraries' too: importing FlashInfer creates its workspace, and the sandbox lets the
    process write only its scratch); never the knobs that dump, override or relocate what
    Triton reads and writes."""
    env = {k: v for k, v in {**os.environ, **context.child_env()}.items()
           if not _UNSAFE_ENV.match(k)}
    for key, value in meta.items():
        if _ENV.match(key) and isinstance(value, str) and len(value) <= 64 \
                and re.fullmatch(r"[A-Za-z0-9_.,:-]*", value):
            env[key] = value
    env["TRITON_CACHE_DIR"] = str(cache)
    for key in _LIBRARY_CACHES:  # the allow-listed modules create them on import: scratch
        env[key] = str(cache.parent / "library-caches")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
