"""FlashInfer autotune results: which runner and tactic won for each tuned operation and
shape. Nothing to compile, so warmd plans no tasks for them; it captures what an engine's
autotuning wrote on one node and installs it on the others (cache.py), so no replica
profiles again in traffic."""

from __future__ import annotations

from warmd.libraries.base import CacheRoot, Library
from warmd.libraries.flashinfer import probe as flashinfer_probe

LIBRARY = Library(
    name="flashinfer_autotune",
    display="FlashInfer autotune",
    probe=flashinfer_probe,
    kernels=(),
    plugin_module="warmd.libraries.flashinfer_autotune.plugin",
    roots=(CacheRoot("vllm_cache_root", "VLLM_CACHE_ROOT"),
           CacheRoot("flashinfer_workspace", "FLASHINFER_WORKSPACE_BASE")),
    entries=lambda root: root / "flashinfer_autotune_cache",
)
