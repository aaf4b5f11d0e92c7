"""DeepGEMM (sgl-deep-gemm): FP8 GEMM kernels JIT-compiled per shape, cached under
DG_JIT_CACHE_DIR. Its executor runs the GEMMs on the local GPU (cache.py, executor.py)."""

from __future__ import annotations

from warmd.libraries.base import CacheRoot, Library
from warmd.libraries.deep_gemm.kernels import KERNELS
from warmd.probes import LibraryProbe, probe_jit_library

# PyPI's "deep-gemm" is an unrelated project.
DISTRIBUTIONS = ("sgl-deep-gemm", "deep_gemm")


def probe() -> LibraryProbe:
    return probe_jit_library(
        "deep_gemm", "deep_gemm", DISTRIBUTIONS,
        missing="DeepGEMM not installed (module deep_gemm; pip install sgl-deep-gemm)",
        cannot_jit="DeepGEMM installed but nvcc missing: it cannot JIT")


LIBRARY = Library(
    name="deep_gemm",
    display="DeepGEMM",
    probe=probe,
    kernels=KERNELS,
    executor="warmd.libraries.deep_gemm.executor:DeepGemmExecutor",
    adapter="warmd.libraries.deep_gemm.cache:make_adapter",
    kernel_stage="warmd.libraries.deep_gemm.compiler:DeepGemmKernelStage",
    roots=(CacheRoot("deep_gemm_dir", "DG_JIT_CACHE_DIR"),
           CacheRoot("vllm_cache_root", "VLLM_CACHE_ROOT")),
    entries=lambda root: root / "cache",
    aliases=("deepgemm",),
)
