"""DeepGEMM's plugin (warmd.libraries.plugin): its executor runs the GEMMs on the local GPU,
its kernel stage compiles each distinct kernel once below the task, and a trusted producer
re-derives a captured kernel from its template arguments."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from warmd.libraries.plugin import LibraryPlugin

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.cache.rederived import Rederived
    from warmd.context import NodeContext
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.executors.base import StageCluster
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
    from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage
    from warmd.libraries.deep_gemm.executor import DeepGemmExecutor
    from warmd.tasks import Task


class DeepGemmPlugin(LibraryPlugin):
    plans_tasks = True
    stages_kernels = True
    rederivation = "from its template arguments, through DeepGEMM's own source templates"

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None
                     ) -> DeepGemmCacheAdapter:
        from warmd.libraries.deep_gemm.cache import make_adapter

        return make_adapter(root, arch)

    def make_executor(self) -> DeepGemmExecutor:
        from warmd.libraries.deep_gemm.executor import DeepGemmExecutor

        return DeepGemmExecutor()

    def kernel_stage(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                     env: dict[str, str], cluster: StageCluster | None,
                     timeout: float | None = None) -> DeepGemmKernelStage:
        from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage

        return DeepGemmKernelStage(root, tasks, jobs, gpu_ids, env, cluster=cluster,
                                   timeout=timeout)

    def rederive(self, adapter: CacheAdapter, name: str, artifact: bytes, scratch: Path,
                 context: NodeContext) -> Rederived:
        from warmd.libraries.deep_gemm.rederive import rederive

        return rederive(cast("DeepGemmCacheAdapter", adapter), name, artifact, scratch,
                        context=context)


PLUGIN = DeepGemmPlugin()
