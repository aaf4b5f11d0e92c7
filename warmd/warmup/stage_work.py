"""What a library's kernel stage asks of the cluster (warmd.executors.base.StageCluster):
its kernel lists, its discovery slices and its kernels, each slice and each kernel a unit
of cluster work claimed through one ``ClaimLoop`` (warmd.warmup.claims), like every other
unit of a run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warmd.cache.base import CacheAdapter
from warmd.coordination import BootReport, DiscoveryReport, KernelList, WorkKind
from warmd.warmup.claims import Built, ClaimLoop, Unit, store_order
from warmd.warmup.events import Event, KernelEvent, UnitDone, boot
from warmd.warmup.report import Build
from warmd.warmup.state import LibraryState, RunState
from warmd.warmup.units import tell_building

if TYPE_CHECKING:
    from warmd.store.api import SharedCache


class StageWork:
    """The stage's cluster over the run's shared cache and the library's part of the run:
    kernel lists, discovery slices claimed one by one (each list published as soon as its
    slice is discovered), and kernels claimed one by one, each published as soon as built
    and installed (counted as the shared cache's) as soon as another node publishes it."""

    def __init__(self, run: RunState, library: LibraryState, builder: bool) -> None:
        assert run.shared is not None and library.adapter is not None
        self.run = run
        self.shared: SharedCache = run.shared
        self.library, self.adapter = library, library.adapter
        self.builder = builder
        self.events = run.events
        self.wait_limit = run.options.single_flight_timeout

    def kernel_list(self, tasks: list[str]) -> KernelList:
        return self.shared.lists.kernel_list(self.adapter, tasks)

    def publish_kernel_list(self, digest: str, tasks: dict[str, list[str]],
                            jobs: dict[str, dict],
                            also: dict[str, list[str]] | None = None) -> bool:
        return self.shared.lists.publish_kernel_list(self.adapter, digest, tasks, jobs, also)

    def wait(self, seconds: float) -> None:
        self.shared.claims.wait(self.adapter, seconds)

    def run_kernels(self, build: Callable[[str], tuple[bool, float, str]], threads: int,
                    expected: Callable[[str], float] | None = None) -> KernelRun:
        return KernelRun(self, build, threads, expected)

    def run_discovery(self, slices: list[str],
                      discover: Callable[[str, Any], tuple[bool, float, str]],
                      take: Callable[[list[str]], set[str]],
                      contexts: list[Any]) -> SliceRun:
        return SliceRun(self, slices, discover, take, contexts)


class KernelRun:
    """A stage's kernels through a ClaimLoop in the background (StageWork.run_kernels)."""

    def __init__(self, work: StageWork, build: Callable[[str], tuple[bool, float, str]],
                 threads: int, expected: Callable[[str], float] | None = None) -> None:
        self.work, self.build_one, self.expected = work, build, expected
        self.loop: ClaimLoop[None] = ClaimLoop(work.shared, [None] * max(1, threads),
                                               self._build, self._install,
                                               work.events, done=self._done, begun=self._begun,
                                               wait_limit=work.wait_limit)
        self.thread = threading.Thread(target=self.loop.run, daemon=True,
                                       name="warmd-stage-claims")
        self.thread.start()

    def add(self, names: list[str]) -> None:
        self.loop.add([Unit(name, self.work.adapter,
                            expected=self.expected(name) if self.expected else 0.0)
                       for name in names])

    def close(self) -> None:
        self.loop.close()

    def join(self) -> BootReport:
        self.thread.join()
        return boot(_units(self.work, WorkKind.ENTRY), self.loop.timeline.to_json())

    def _build(self, unit: Unit, _context: None) -> Built:
        adapter = self.work.adapter
        if any(e.name == unit.name for e in adapter.list_entries()):
            return Built(True)  # here already (a seeded or earlier entry)
        ok, seconds, error = self.build_one(unit.name)
        if ok and not unit.local_only:
            entries = [e for e in adapter.list_entries() if e.name == unit.name]
            self.work.shared.entries.publish_entries(adapter, entries, seconds)
        return Built(ok, seconds, error)

    def _begun(self, unit: Unit) -> None:
        tell_building(self.work.run, Build(unit.name, self.work.library.name), True)

    def _done(self, unit: Unit, event: Event) -> None:
        if event.kind is not KernelEvent.INSTALLED:
            tell_building(self.work.run, Build(unit.name, self.work.library.name), False)

    def _install(self, adapter: CacheAdapter, units: list[Unit]) -> set[str]:
        names = [u.name for u in units]
        shared = self.work.shared
        return set(self.work.library.installing(
            shared, lambda a: shared.entries.install_entries(a, names)))


class SliceRun:
    """A stage's discovery slices through a ClaimLoop in the background
    (StageWork.run_discovery): a slice this node holds is discovered on one of its
    discovery processes, one another node listed is taken from its list, one held by a
    node that died (its claim expired) or past the single-flight timeout is discovered
    here. Every slice is known up front (the plan's), so the loop is closed at once."""

    def __init__(self, work: StageWork, slices: list[str],
                 discover: Callable[[str, Any], tuple[bool, float, str]],
                 take: Callable[[list[str]], set[str]], contexts: list[Any]) -> None:
        self.work, self.discover, self.take = work, discover, take
        self.loop: ClaimLoop[Any] = ClaimLoop(work.shared, list(contexts), self._build,
                                              self._install, work.events,
                                              wait_limit=work.wait_limit)
        self.loop.add([Unit(d, work.adapter, WorkKind.DISCOVERY)
                       for d in store_order(work.shared, list(slices))])
        self.loop.close()
        self.thread = threading.Thread(target=self.loop.run, daemon=True,
                                       name="warmd-discovery-claims")
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self) -> None:
        self.loop.stop()

    def join(self) -> DiscoveryReport:
        self.thread.join()
        slices = _units(self.work, WorkKind.DISCOVERY)
        return DiscoveryReport(
            slices=len(slices),
            discovered_here=sum(s.got is KernelEvent.BUILT for s in slices),
            read=sum(s.got is KernelEvent.INSTALLED for s in slices),
            failed=sum(s.got is KernelEvent.FAILED for s in slices),
            taken_over=sum(s.took_over for s in slices),
            waited_seconds=round(max((s.waited for s in slices), default=0.0), 3),
            timeline=self.loop.timeline.to_json())

    def _build(self, unit: Unit, context: Any) -> Built:
        ok, seconds, error = self.discover(unit.name, context)
        return Built(ok, seconds, error)

    def _install(self, _adapter: CacheAdapter, units: list[Unit]) -> set[str]:
        return self.take([u.name for u in units])


def _units(work: StageWork, kind: WorkKind) -> list[UnitDone]:
    """The stage's units of this kind done here, as the run's events say."""
    return work.events.derived().of([work.adapter.library], [kind])
