"""Triton's plugin (warmd.libraries.plugin): the engine compiles its kernels at run time, so
no executor; a trusted producer re-derives a captured kernel from the library's kernel
function."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from warmd.libraries.plugin import LibraryPlugin

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.cache.rederived import Rederived
    from warmd.context import NodeContext
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.libraries.triton.cache import TritonCacheAdapter


class TritonPlugin(LibraryPlugin):
    rederivation = ("from the library's kernel function (allow-listed modules; kernels not "
                    "found there stay local)")

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None
                     ) -> TritonCacheAdapter | None:
        from warmd.libraries.triton.cache import make_adapter

        return make_adapter(root, arch)

    def rederive(self, adapter: CacheAdapter, name: str, artifact: bytes, scratch: Path,
                 context: NodeContext) -> Rederived:
        from warmd.libraries.triton.rederive import rederive

        return rederive(cast("TritonCacheAdapter", adapter), name, artifact, scratch,
                        context=context)


PLUGIN = TritonPlugin()
