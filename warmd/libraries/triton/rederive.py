"""Re-deriving a captured Triton kernel: its recorded IR compiled again by this node's Triton.

A kernel entry records the IR Triton's frontend made (``<kernel>.ttir``) and the options it
compiled with (``<kernel>.json``). The rebuild compiles that IR (``triton.compile`` of an IR
file, in a process of its own) with the options Triton's launch parameters set (warps,
stages, CTAs, register cap, fp fusion, cooperative launch, PDL), never with the metadata's
paths or free-form options (``extern_libs``, ``ptx_options``, ``ir_override`` name files and
ptxas flags: the rebuild uses this node's own), and IR that links a bitcode library other
than Triton's own is refused. The re-derived entry holds the claim's IR and this node's
ttgir, LLVM IR, PTX, cubin and metadata (its ``hash``, the engine's key that names the
directory, taken from the claim and checked against the name).

Measured (tests/capture/test_capture_rederive.py, triton 3.9, sm_90 on a CPU machine): the rebuild
reproduces every stage byte for byte when it sees the engine's Triton tool knobs (importing
FlashInfer sets TRITON_PTXAS_BLACKWELL_PATH, which changes the cubin: this node's own knobs
are kept); the metadata differs only in ``hash`` (an IR compile keys on the IR, the
engine's on the Python source), which is why the claim's is kept.

What is not re-derived: the key itself, a hash of the kernel's Python source and Triton's,
which the cache does not hold; and host modules (``cuda_utils``, launchers: one ``.so``,
no source), which are refused.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import unpack_safely
from warmd.cache.base import CacheEntry, UnsafeArtifact
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveRefused,
    run_rebuild,
)
from warmd.cache.safe_fs import CacheTree, load_json
from warmd.libraries.triton.cache import (
    ENTRY_RE,
    GROUP_RE,
    MAX_GROUP_BYTES,
    TritonCacheAdapter,
    host_module,
)

KERNEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
STAGES = ("ttgir", "llir", "ptx", "cubin")  # what the rebuild makes from the IR
INPUTS = ("source", "ttir")  # what the claim records and the re-derived entry keeps
# Launch parameters a kernel's options may carry, with what each may be.
_OPTIONS = {
    "num_warps": lambda v: isinstance(v, int) and v in (1, 2, 4, 8, 16, 32),
    "num_ctas": lambda v: isinstance(v, int) and 1 <= v <= 16,
    "num_stages": lambda v: isinstance(v, int) and 0 <= v <= 16,
    "maxnreg": lambda v: v is None or (isinstance(v, int) and 16 <= v <= 255),
    "enable_fp_fusion": lambda v: isinstance(v, bool),
    "launch_cooperative_grid": lambda v: isinstance(v, bool),
    "launch_pdl": lambda v: isinstance(v, bool),
}
_ENV = re.compile(r"^TRITON_[A-Z0-9_]{1,64}$")
# Knobs that dump, override or relocate what Triton reads and writes: never in a rebuild
# (this node's tool paths, TRITON_PTXAS_*_PATH among them, are kept: they shape the cubin).
_UNSAFE_ENV = re.compile(r"^TRITON_(CACHE|HOME|DUMP|OVERRIDE|KERNEL_DUMP|KERNEL_OVERRIDE|"
                         r"ALWAYS_COMPILE|INTERPRET|STORE_BINARY_ONLY)")
_LIBPATH = re.compile(r'libpath\s*=\s*"([^"]*)"')


def rederive(adapter: TritonCacheAdapter, name: str, artifact: bytes,
             scratch: Path) -> Rederived:
    if not ENTRY_RE.match(name):
        raise RederiveRefused(f"not a Triton cache entry name: {name!r}")
    claim = scratch / "claim" / name
    unpack_safely(artifact, claim)
    tree = CacheTree(claim.parent)
    if host_module(tree, name) is not None:
        raise RederiveRefused("a Triton host module (launcher, cuda_utils) records no "
                              "source to rebuild it from")
    kernel, files = _kernel_files(tree, name)
    meta = _metadata(tree, name, kernel)
    _check_ir(tree.read(f"{name}/{kernel}.ttir").data.decode(errors="replace"))
    out = scratch / "rebuilt"
    out.mkdir(parents=True)
    run_rebuild([sys.executable, "-m", "warmd.libraries.triton.rederive",
                 str(claim / f"{kernel}.ttir"), str(out),
                 json.dumps({"arch": _arch(meta), "options": _options(meta)})],
                env=_rebuild_env(meta, scratch / "triton-cache"), cwd=str(scratch))
    entry = scratch / "entry" / name
    entry.mkdir(parents=True)
    rebuilt = {f"{kernel}.{stage}" for stage in STAGES}
    for child in files:
        source = out if child in rebuilt else claim
        if child == f"{kernel}.json":
            data = json.loads((out / child).read_text())
            data["hash"] = meta["hash"]
            (entry / child).write_text(json.dumps(data))
        else:
            (entry / child).write_bytes((source / child).read_bytes())
    (entry / f"__grp__{kernel}.json").write_text(json.dumps(
        {"child_paths": {child: str(entry / child) for child in files}}))
    ours = TritonCacheAdapter(entry.parent, adapter.arch)
    packed = ours.pack(CacheEntry(adapter.library, name, entry))
    differs = tuple(child for child in files
                    if (entry / child).read_bytes() != (claim / child).read_bytes())
    return Rederived(packed, packed == artifact, differs)


def _kernel_files(tree: CacheTree, name: str) -> tuple[str, list[str]]:
    """The kernel's name and the files its one group lists (its IR, metadata and cubin
    among them, nothing else than Triton's stages)."""
    groups = [g for g in tree.listdir(name) if GROUP_RE.match(g)]
    if len(groups) != 1:
        raise RederiveRefused(f"a Triton kernel entry has one group file, not {len(groups)}")
    kernel = groups[0][len("__grp__"):-len(".json")]
    if not KERNEL_RE.match(kernel):
        raise RederiveRefused(f"not a Triton kernel name: {kernel!r}")
    data = tree.read_json(f"{name}/{groups[0]}", MAX_GROUP_BYTES)
    children = data.get("child_paths") if isinstance(data, dict) else None
    allowed = {f"{kernel}.{ext}" for ext in (*INPUTS, *STAGES, "json")}
    if not isinstance(children, dict) or not set(children) <= allowed:
        raise RederiveRefused(f"the group of {kernel} lists files Triton does not write")
    needed = {f"{kernel}.ttir", f"{kernel}.json", f"{kernel}.cubin"}
    if not needed <= set(children):
        raise RederiveRefused(f"the entry lacks {sorted(needed - set(children))}: nothing "
                              "to rebuild from")
    return kernel, sorted(children)


def _metadata(tree: CacheTree, name: str, kernel: str) -> dict:
    meta = load_json(tree.read(f"{name}/{kernel}.json").data, MAX_GROUP_BYTES,
                     f"{name}/{kernel}.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("hash"), str) \
            or not re.fullmatch(r"[0-9a-f]{64}", meta["hash"]):
        raise RederiveRefused(f"the metadata of {kernel} holds no key hash")
    if _entry_name(meta["hash"]) != name:
        raise RederiveRefused(f"the metadata's key is not the entry's name {name}")
    if meta.get("name") != kernel:
        raise RederiveRefused(f"the metadata names another kernel than {kernel}")
    return meta


def _entry_name(digest: str) -> str:
    """The directory Triton's cache keeps a key's files in (base32 of its sha256)."""
    return base64.b32encode(bytes.fromhex(digest)).decode().rstrip("=")


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


def _rebuild_env(meta: dict, cache: Path) -> dict[str, str]:
    """This process's environment (this node's own Triton knobs too: line info, for one,
    is not in a kernel's metadata and changes its cubin), the claim's cache-invalidating
    knobs (as Triton records them: short strings) over it, and a scratch cache; never
    the knobs that dump, override or relocate what Triton reads and writes."""
    env = {k: v for k, v in os.environ.items() if not _UNSAFE_ENV.match(k)}
    for key, value in meta.items():
        if _ENV.match(key) and isinstance(value, str) and len(value) <= 64 \
                and re.fullmatch(r"[A-Za-z0-9_.,:-]*", value):
            env[key] = value
    env["TRITON_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _check_ir(ttir: str) -> None:
    """IR may name a bitcode library to link (``libpath``): only Triton's own."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        raise CannotRederiveHere("Triton is not installed here")
    own = str(Path(next(iter(spec.submodule_search_locations))).resolve()) + "/"
    for path in _LIBPATH.findall(ttir):
        if path and not os.path.realpath(path).startswith(own):
            raise RederiveRefused("the IR links a bitcode library outside Triton's own")


def _compile(ttir: Path, out: Path, how: dict) -> None:
    """In the rebuild process: compile the IR for its arch and write each stage and the
    metadata Triton wrote."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = ttir.stem
    compiled = triton.compile(str(ttir), target=GPUTarget("cuda", how["arch"], 32),
                              options=how["options"])
    for stage in STAGES:
        data = compiled.asm[stage]
        (out / f"{kernel}.{stage}").write_bytes(data if isinstance(data, bytes)
                                                else data.encode())
    written = next(settings.triton_cache_dir().glob("*/*.json"))
    meta = [p for p in written.parent.glob("*.json") if not p.name.startswith("__grp__")]
    (out / f"{kernel}.json").write_bytes(meta[0].read_bytes())


if __name__ == "__main__":
    try:
        _compile(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))
    except UnsafeArtifact as exc:
        sys.exit(f"refused: {exc}")
