"""What a JIT library's code does for warmd: its ``LibraryPlugin``, one module per library
(``Library.plugin_module``, e.g. warmd/libraries/deep_gemm/plugin.py) that defines
``PLUGIN``, an instance of a ``LibraryPlugin`` subclass.

The registry (``Library``) is data the planner reads without importing the library's code;
the plugin module is imported only where its parts are used (``Library.plugin()``), and
imports the library's executor, cache, compiler and re-derivation modules inside the methods
that use them: none of them is imported to plan, and the GPU libraries they import (torch,
deep_gemm, flashinfer, triton) only in the process that runs them.

A plugin subclasses ``LibraryPlugin`` and overrides what its library does; the defaults here
are a library warmd only captures and shares (no executor, no kernel stage, one unit of
cluster work per task, nothing re-derived); ``make_adapter`` it must define. What a library
can do is said by typed attributes (``plans_tasks``, ``stages_kernels``, ``rederivation``),
read before anything is built; a method of a capability it lacks is never called (and
raises: TypeError, CannotRederiveHere). A type checker follows each plugin module's
methods, lazy imports included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.cache.rederived import Rederived
    from warmd.context import NodeContext
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.executors.base import Executor, KernelStage, StageCluster
    from warmd.tasks import Task


@runtime_checkable
class LibraryPlugin(Protocol):
    """A library's executor, cache adapter, worker environment, kernel stage, task split and
    re-derivation, for warmd to call."""

    # Whether warmd plans and compiles this library's kernels (make_executor gives its
    # executor); False: a cache warmd only captures and shares (what the engine compiled at
    # run time), never plans tasks for.
    plans_tasks: bool = False
    # Whether kernel_stage gives a stage that compiles cold tasks below the task (each
    # distinct kernel once, on every core); False: per task only.
    stages_kernels: bool = False
    # How a trusted producer re-derives what a node captured (warmd.rederive; `warmd status`
    # and `warmd plan` show it); None: its captured entries are never re-derived (they stay
    # pending) and rederive is never called.
    rederivation: str | None = None

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None
                     ) -> CacheAdapter | None:
        """Its cache at ``root`` for a target arch; ``dirs``: the directories the plan's
        engine reads (None: this process's settings). None when the library is not
        installed here. Called through ``Library.make_adapter``."""
        ...

    def make_executor(self) -> Executor:
        """Its executor, made in a worker process (imports the library); called only when
        ``plans_tasks``."""
        raise TypeError(f"{type(self).__name__} plans no tasks: it has no executor")

    def worker_env(self, arch: str, root: Path) -> dict[str, str]:
        """What its worker processes need set before they import it, for a target arch and
        its cache root."""
        return {}

    def kernel_stage(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                     env: dict[str, str], cluster: StageCluster | None,
                     timeout: float | None = None) -> KernelStage:
        """A stage compiling the cold ``tasks`` into ``root`` (not started yet) with ``jobs``
        compile jobs on ``gpu_ids``, ``env`` its workers' environment, each discovery piece
        and compile killed after ``timeout`` seconds; called only when ``stages_kernels``."""
        raise TypeError(f"{type(self).__name__} has no kernel stage")

    def task_kernels(self, task: Task) -> tuple[tuple[str, Task], ...] | None:
        """The entries the task makes, known before it runs, each with a task that builds
        only it, so that each is one unit of cluster work (warmd.warmup.claims); None: the
        task is the unit."""
        return None

    def rederive(self, adapter: CacheAdapter, name: str, artifact: bytes, scratch: Path,
                 context: NodeContext) -> Rederived:
        """Rebuild a captured entry ``name`` (its claimed ``artifact``) from what it was
        built from, in ``scratch``, as a trusted producer does (warmd.rederive), with the
        producer's context (its rebuild processes get ``context.child_env()``); called only
        when ``rederivation`` is set."""
        from warmd.cache.rederived import CannotRederiveHere

        raise CannotRederiveHere(f"{adapter.library} entries cannot be re-derived")

