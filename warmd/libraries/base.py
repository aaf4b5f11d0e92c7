"""What a JIT library registers with warmd, once, in its package's ``LIBRARY``, and what a
helper the planner only probes for (nvcc, sgl-kernel, CUTLASS DSL) registers: ``Helper``.

Registering imports no GPU library: the probe finds the library without importing it, and
the executor, the cache adapter and the worker environment are named as "module:attribute"
and imported only where they run (the executor in a worker process, the adapter in the
warmup that needs it), through ``resolve``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmd import knobs
from warmd.kernels.base import Kernel
from warmd.probes import LibraryProbe

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.engines.cache_dirs import CacheDirs


@dataclass(frozen=True)
class CacheRoot:
    """A directory a library's cache depends on: the engine's variable for it (a knob in
    knobs.KNOBS) and its key under warmd.yaml's ``cache:`` section."""

    config_key: str
    env: str

    def default(self) -> Path:
        """The root as this process's environment sets it (or its default)."""
        return knobs.get(self.env)


@dataclass(frozen=True)
class Library:
    name: str  # as tasks, --library and warmd.yaml name it
    display: str  # as messages name it
    probe: Callable[..., LibraryProbe]  # found without importing the library
    kernels: tuple[type[Kernel], ...]  # its kernels (preference order: kernels/preferences.py)
    # "module:Class", made in the worker with no arguments; None: a cache warmd only captures
    # and shares (what the engine compiled at run time), never plans tasks for
    executor: str | None
    adapter: str  # "module:function" (root, target arch) -> CacheAdapter | None (not here)
    # roots[0] is the cache root the executor compiles into; later ones only feed its default
    roots: tuple[CacheRoot, ...]
    entries: Callable[[Path], Path]  # where under the root its entries lie (for sizes)
    # "module:function" (target arch, root) -> extra variables its worker processes need
    worker_env: str | None = None
    builds_without_gpu: bool = False  # a GPU-less builder node warms it
    # "module:Class" of a warmd.executors.base.KernelStage that compiles cold tasks below
    # the task (each distinct kernel once, on every core); None: per task only
    kernel_stage: str | None = None
    # "module:function" (task) -> ((entry name, a task that builds only it), ...): the
    # entries a task makes, known before it runs, so that each is one unit of cluster work
    # (warmd.warmup.claims); None: the task is the unit
    task_kernels: str | None = None
    aliases: tuple[str, ...] = ()  # other spellings accepted by --with/--without
    # True: probe(engine) finds the library the way that engine imports it ("vllm",
    # "sglang"); probe() the way any engine could
    probe_follows_engine: bool = False
    # "module:function" (adapter, entry name, claimed artifact, scratch dir) ->
    # warmd.cache.rederived.Rederived: how a trusted producer rebuilds what a node captured
    # (warmd.rederive); None: its captured entries are never re-derived (they stay pending)
    rederive: str | None = None
    # True: its adapter factory also takes the engine's CacheDirs (stores it reads beyond
    # its root: FlashInfer autotune's)
    adapter_takes_dirs: bool = False

    @property
    def root(self) -> CacheRoot:
        return self.roots[0]

    @property
    def plans_tasks(self) -> bool:
        """Whether warmd plans and compiles this library's kernels (else: captured only)."""
        return self.executor is not None

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None = None
                     ) -> CacheAdapter | None:
        """Its cache adapter at ``root`` for a target arch: the one way warmd builds one;
        ``dirs``: the directories the plan's engine reads (None: this process's settings).
        None when this warmd has no adapter module for it, or the library is not here."""
        try:
            factory = resolve(self.adapter)
        except ModuleNotFoundError as exc:
            if not names_module(exc, self.adapter):
                raise
            return None
        if self.adapter_takes_dirs and dirs is not None:
            return factory(Path(root), arch, dirs)
        return factory(Path(root), arch)

    def worker_environment(self, arch: str, root: Path) -> dict[str, str]:
        """What its worker processes need set before they import it (none: {})."""
        return dict(resolve(self.worker_env)(arch, root)) if self.worker_env else {}


@dataclass(frozen=True)
class Helper:
    """A library the planner only probes for (a kernel needs it), with no cache to warm."""

    name: str
    display: str
    probe: Callable[[], LibraryProbe]
    aliases: tuple[str, ...] = ()


def resolve(reference: str) -> Any:
    """The object a "module:attribute" reference names (imports the module); ValueError for
    a reference of another form."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} is not 'module.path:attribute'")
    return getattr(importlib.import_module(module_name), attribute)


def names_module(exc: ModuleNotFoundError, reference: str) -> bool:
    """Whether the module missing is the reference's own (not one it imports)."""
    return exc.name == reference.partition(":")[0]
