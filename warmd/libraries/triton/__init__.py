"""Triton: kernels the engine JIT-compiles at run time (vLLM's and SGLang's Triton MoE,
attention and quantization kernels, Inductor's generated kernels), cached per content hash
under TRITON_CACHE_DIR. warmd plans no tasks for them: it captures the entries the engine
compiled on one node and installs them on the others (cache.py)."""

from __future__ import annotations

from warmd.libraries.base import CacheRoot, Library
from warmd.probes import LibraryProbe, dist_version, module_location


def probe() -> LibraryProbe:
    location = module_location("triton")
    if location is None:
        return LibraryProbe("triton", False, reason="Triton not installed (module triton; "
                            "it ships with CUDA builds of torch)")
    # Triton compiles with the ptxas it ships: no toolkit needed
    return LibraryProbe("triton", True, dist_version(("triton",)), can_jit=True,
                        location=location)


LIBRARY = Library(
    name="triton",
    display="Triton",
    probe=probe,
    kernels=(),
    plugin_module="warmd.libraries.triton.plugin",
    roots=(CacheRoot("triton_cache_dir", "TRITON_CACHE_DIR"),),
    entries=lambda root: root,
)
