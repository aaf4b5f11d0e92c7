"""What a warmup run knows while it runs: one record per task and one per library.

A task's record (``TaskState``) is written by one thread at a time: the scheduler before the
workers start (its local record, the prefetch's answer, whether it is verified warm), then
the worker that runs it. What the tasks of a library share (``LibraryState``: its fingerprint,
and through the run's events the entries the shared cache installed in this run) changes
under that library's lock, through methods that keep it whole. What happened to each kernel
is on the run's one record of events (warmd.warmup.events), which every library shares.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from warmd.cache.base import CacheAdapter
from warmd.cache.records import LocalTaskRecord, fingerprint_digest, read_record
from warmd.executors.base import KernelStage
from warmd.plan import Plan
from warmd.tasks import Task
from warmd.warmup.events import Event, KernelEvent, RunEvents
from warmd.warmup.options import WarmupOptions
from warmd.warmup.report import Build, TaskReport

if TYPE_CHECKING:
    from warmd.store.api import SharedCache

T = TypeVar("T")
Building = Callable[[Build, bool], None]  # (the unit, True as it begins / False as it ends)


@dataclass(frozen=True)
class StoreAnswer:
    """What the shared cache said of one task."""

    entries: tuple[str, ...] | None  # the entries it installed for it; None: it lacks it

    @property
    def found(self) -> bool:
        return self.entries is not None


class LibraryState:
    """One library's part of a run, shared by every worker thread."""

    def __init__(self, name: str, adapter: CacheAdapter | None,
                 events: RunEvents | None = None) -> None:
        self.name = name
        self.adapter = adapter
        self.events = events if events is not None else RunEvents()  # the run's
        self.stage: KernelStage | None = None  # set before the workers start
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        self._fingerprinted = False  # worked out once, when a task first needs it

    def installing(self, shared: SharedCache, fetch: Callable[[CacheAdapter], T]) -> T:
        """Run a fetch from the shared cache, noting the entries it newly installed (what
        then counts as remote hits). New in the root is not enough: this node's compile
        threads finish entries while a fetch runs; only what the store installed counts."""
        adapter = self.adapter
        assert adapter is not None
        before = {e.name for e in adapter.list_entries()}
        result = fetch(adapter)
        installed_here = shared.entries.installed_seconds
        for name in sorted(e.name for e in adapter.list_entries() if e.name not in before
                           and installed_here(adapter.library, e.name) is not None):
            self.events.add(Event(KernelEvent.INSTALLED, adapter.library, name))
        return result

    def installed(self) -> frozenset[str]:
        """The entries the shared cache installed in this run."""
        assert self.adapter is not None
        return self.events.installed(self.adapter.library)

    def fingerprint(self) -> str | None:
        assert self.adapter is not None
        with self._lock:
            if not self._fingerprinted:
                self._fingerprint = fingerprint_digest(self.adapter)
                self._fingerprinted = True
            return self._fingerprint


@dataclass
class TaskState:
    """One task of the run: what is known of it before and while a worker runs it."""

    task: Task
    library: LibraryState
    record: LocalTaskRecord  # this node's record of the task, read once
    answer: StoreAnswer | None = None  # None: the shared cache was not asked or did not answer
    warm: TaskReport | None = None  # verified from its entries alone, before the run
    # entry -> whether its bytes matched the record (hashed once for the task)
    vouched: dict[str, bool] = field(default_factory=dict)

    @property
    def found(self) -> tuple[str, ...] | None:
        """The entries the shared cache installed for it; None: none were found (yet)."""
        return self.answer.entries if self.answer is not None else None

    @property
    def settled(self) -> bool:
        """Whether it needs no compile here: verified warm, or found in the shared cache."""
        return self.warm is not None or self.found is not None

    @property
    def store_lacks(self) -> bool:
        """Whether the shared cache answered without it: a node warm from its own disk then
        shares what it has."""
        return self.answer is not None and not self.answer.found


class RunState:
    """The plan, its options and shared cache, and the state of every selected task."""

    def __init__(self, plan: Plan, options: WarmupOptions, shared: SharedCache | None,
                 tasks: list[Task], building: Building | None = None) -> None:
        self.plan, self.options, self.shared = plan, options, shared
        self.building = building  # hears of each unit built here, as it begins and ends
        self.events = RunEvents()  # what happened to each kernel in the run
        self.libraries = {name: LibraryState(name, _adapter(name, plan, options), self.events)
                          for name in sorted({t.library for t in tasks})}
        self.tasks = [self._state(task) for task in tasks]

    def _state(self, task: Task) -> TaskState:
        library = self.libraries[task.library]
        record = (read_record(library.adapter.root, task.key) if library.adapter is not None
                  else LocalTaskRecord(task.key))
        return TaskState(task, library, record)

    def stages(self) -> list[KernelStage]:
        return [lib.stage for lib in self.libraries.values() if lib.stage is not None]


def _adapter(library: str, plan: Plan, options: WarmupOptions) -> CacheAdapter | None:
    """The parent's view of a library's cache (for records and the shared cache); None when
    the library or its adapter is not installed here."""
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(library)
    if registered is None:
        return None
    target = plan.env.target
    adapter = registered.make_adapter(options.cache_roots[library], target.arch, plan.dirs())
    if options.builder and adapter is not None:
        return adapter.for_gpu(target.arch, target.sms)
    return adapter
