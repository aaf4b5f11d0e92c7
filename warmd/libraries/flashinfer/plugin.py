"""FlashInfer's plugin (warmd.libraries.plugin): its executor builds modules with ninja/nvcc
(no GPU needed), its workers need their arch and build tools set before they import it, and
a trusted producer re-derives a captured module from its URI."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from warmd.libraries.plugin import LibraryPlugin

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.cache.rederived import Rederived
    from warmd.context import NodeContext
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
    from warmd.libraries.flashinfer.executor import FlashInferExecutor


class FlashInferPlugin(LibraryPlugin):
    plans_tasks = True
    rederivation = "from its URI, through FlashInfer's gen_* specs"

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None
                     ) -> FlashInferCacheAdapter | None:
        from warmd.libraries.flashinfer.cache import make_adapter

        return make_adapter(root, arch)

    def make_executor(self) -> FlashInferExecutor:
        from warmd.libraries.flashinfer.executor import FlashInferExecutor

        return FlashInferExecutor()

    def worker_env(self, arch: str, root: Path) -> dict[str, str]:
        from warmd.libraries.flashinfer.executor import worker_env

        return worker_env(arch, root)

    def rederive(self, adapter: CacheAdapter, name: str, artifact: bytes, scratch: Path,
                 context: NodeContext) -> Rederived:
        from warmd.libraries.flashinfer.rederive import rederive

        return rederive(cast("FlashInferCacheAdapter", adapter), name, artifact, scratch,
                        context=context)


PLUGIN = FlashInferPlugin()
