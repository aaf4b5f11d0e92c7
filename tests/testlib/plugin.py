"""testlib's plugin (warmd.libraries.plugin): its executor, its adapter, and each task's
entries as units of cluster work."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from warmd.libraries.plugin import LibraryPlugin

if TYPE_CHECKING:
    from testlib.cache import DirAdapter
    from testlib.executor import TestlibExecutor
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.tasks import Task


class TestlibPlugin(LibraryPlugin):
    plans_tasks = True

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None) -> DirAdapter:
        from testlib.cache import make_adapter

        return make_adapter(root, arch)

    def make_executor(self) -> TestlibExecutor:
        from testlib.executor import TestlibExecutor

        return TestlibExecutor()

    def task_kernels(self, task: Task) -> tuple[tuple[str, Task], ...]:
        from testlib.executor import task_kernels

        return task_kernels(task)


PLUGIN = TestlibPlugin()
