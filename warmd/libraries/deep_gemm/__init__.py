"""DeepGEMM: FP8 GEMM kernels JIT-compiled per shape, cached under DG_JIT_CACHE_DIR: an
external ``deep_gemm`` (sgl-deep-gemm, or DeepGEMM built from source) or the copy vLLM
vendors as ``vllm.third_party.deep_gemm`` (install.py says which one an engine imports).
Its executor runs the GEMMs on the local GPU (plugin.py: cache.py, executor.py, compiler.py)."""

from __future__ import annotations

from warmd.libraries.base import CacheRoot, Library
from warmd.libraries.deep_gemm.install import resolve
from warmd.libraries.deep_gemm.kernels import KERNELS
from warmd.probes import LibraryProbe, probe_nvcc

MISSING = {
    "vllm": "DeepGEMM not installed (neither module deep_gemm nor vLLM's "
            "vllm.third_party.deep_gemm; pip install sgl-deep-gemm)",
    "sglang": "DeepGEMM not installed (module deep_gemm; pip install sgl-deep-gemm)",
}


def probe(engine: str | None = None) -> LibraryProbe:
    """The DeepGEMM the engine (None: any engine) would import, found without importing."""
    found = resolve(engine)
    if found is None:
        return LibraryProbe("deep_gemm", False, reason=MISSING.get(engine or "", MISSING["vllm"]))
    can_jit = probe_nvcc().available
    reason = "" if can_jit else "DeepGEMM installed but nvcc missing: it cannot JIT"
    return LibraryProbe("deep_gemm", True, found.version, reason, can_jit=can_jit,
                        location=str(found.location), module=found.module)


LIBRARY = Library(
    name="deep_gemm",
    display="DeepGEMM",
    probe=probe,
    kernels=KERNELS,
    plugin_module="warmd.libraries.deep_gemm.plugin",
    roots=(CacheRoot("deep_gemm_dir", "DG_JIT_CACHE_DIR"),
           CacheRoot("vllm_cache_root", "VLLM_CACHE_ROOT"),),
    entries=lambda root: root / "cache",
    aliases=("deepgemm",),
    # a builder builds the kernels GPU nodes' discoveries listed (it cannot discover)
    builds_without_gpu=True,
    probe_follows_engine=True,
)
