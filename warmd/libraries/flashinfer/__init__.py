"""FlashInfer: attention, GEMM, activation and sampling modules JIT-built with ninja/nvcc,
cached under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer. Builds need nvcc, not a GPU, so a
GPU-less builder node can warm them (plugin.py: cache.py, executor.py)."""

from __future__ import annotations

from warmd.libraries.base import CacheRoot, Library
from warmd.libraries.flashinfer.kernels import KERNELS
from warmd.probes import LibraryProbe, dist_version, probe_jit_library

AOT_PACKAGES = ("flashinfer-cubin", "flashinfer-jit-cache")


def probe() -> LibraryProbe:
    return probe_jit_library(
        "flashinfer", "flashinfer", ("flashinfer-python",),
        missing="FlashInfer not installed (module flashinfer; pip install flashinfer-python)",
        cannot_jit="FlashInfer installed but neither nvcc nor AOT packages found",
        jit_without_nvcc=any(dist_version((pkg,)) for pkg in AOT_PACKAGES))


LIBRARY = Library(
    name="flashinfer",
    display="FlashInfer",
    probe=probe,
    kernels=KERNELS,
    plugin_module="warmd.libraries.flashinfer.plugin",
    roots=(CacheRoot("flashinfer_workspace", "FLASHINFER_WORKSPACE_BASE"),),
    entries=lambda base: base / ".cache" / "flashinfer",
    builds_without_gpu=True,
)
