"""FlashInfer autotune's plugin (warmd.libraries.plugin): nothing to compile, so no executor;
its adapter reads the stores the plan's engine reads, and a trusted producer checks a
captured result by FlashInfer's own rules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from warmd.libraries.plugin import LibraryPlugin

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.cache.rederived import Rederived
    from warmd.context import NodeContext
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.libraries.flashinfer_autotune.cache import FlashInferAutotuneAdapter


class FlashInferAutotunePlugin(LibraryPlugin):
    rederivation = "checked by FlashInfer's own rules (a measurement)"

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None
                     ) -> FlashInferAutotuneAdapter | None:
        from warmd.libraries.flashinfer_autotune.cache import make_adapter

        return make_adapter(root, arch, dirs)

    def rederive(self, adapter: CacheAdapter, name: str, artifact: bytes, scratch: Path,
                 context: NodeContext) -> Rederived:
        from warmd.libraries.flashinfer_autotune.rederive import rederive

        return rederive(cast("FlashInferAutotuneAdapter", adapter), name, artifact, scratch,
                        context=context)


PLUGIN = FlashInferAutotunePlugin()
