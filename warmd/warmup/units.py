"""A run's cold tasks as units of cluster work (warmd.warmup.claims), and each task's
report made from what its units did.

A library that knows a task's entries before it runs (its plugin's ``task_kernels``) gives one
unit per entry this node lacks, built by a task that makes only that entry and published
the moment it is built; an entry several tasks share is one unit. Any other task (a
FlashInfer module: one task, one entry) is one unit itself, published with its record.
A library with a kernel stage (DeepGEMM) splits its own tasks: its tasks are not units
here.

A task is done when its last unit is: compiled here (counted compiled by the first task
that names it), installed from another node (a remote hit, verified by the store) or
found here (a hit); any unit failed fails the task. Each outcome is what the run's events
say of the unit (warmd.warmup.events). Its record is written and published as always.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmd.cache.base import CacheAdapter
from warmd.coordination import BootReport, WorkKind
from warmd.executors.base import TaskResult
from warmd.executors.pool import Worker
from warmd.stats import Outcome
from warmd.warmup.claims import Built, ClaimLoop, LoopTimeline, Unit, store_order
from warmd.warmup.events import Event, KernelEvent, Naming, boot
from warmd.warmup.report import Build, Mode, TaskReport
from warmd.warmup.state import RunState, TaskState
from warmd.warmup.task import check, compile_task, fetch, finish, name_kernels, publish

if TYPE_CHECKING:
    from warmd.store.api import SharedCache
    from warmd.tasks import Task

Done = Callable[[TaskReport], None]
log = logging.getLogger(__name__)


def tell_building(run: RunState, build: Build, begun: bool) -> None:
    """Tells the run's listener (a live display) that a build here began or ended."""
    if run.building is not None:
        try:
            run.building(build, begun)
        except Exception:  # a display problem must not stop the build
            log.exception("reporting the build of %s failed", build.name)


def splits(state: TaskState) -> bool:
    """Whether the task's cold work goes through units here (not its library's stage)."""
    return state.library.adapter is not None and state.library.stage is None


def _task_kernels(task: Task) -> tuple[tuple[str, Task], ...] | None:
    """The task's entries, each with a task building only it; None: the task is one unit."""
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(task.library)
    return registered.plugin().task_kernels(task) if registered is not None else None


@dataclass(eq=False)
class TaskUnits:
    """One cold task's part of the work: the units it still waits on; of a task split into
    its entries, those entries in order; of a task that is one unit itself, the report its
    build (or install) made."""

    state: TaskState
    needs: set[str] = field(default_factory=set)
    entries: list[str] | None = None  # None: the task is one unit
    report: TaskReport | None = None


class TaskWork:
    """The units of some cold tasks, how each is built and installed, and each task's
    report once its units are done (handed to ``done``)."""

    def __init__(self, run: RunState, states: list[TaskState], done: Done) -> None:
        self.run, self.done = run, done
        self.shared: SharedCache | None = run.shared
        self.units: dict[str, Unit] = {}
        self.tasks = [TaskUnits(state) for state in states]
        self.by_unit: dict[str, list[TaskUnits]] = {}
        self.left_over: list[TaskState] = []  # to run through the library as before
        self.lock = threading.Lock()
        # In the plan's order (not this node's task order): the store spreads nodes over
        # one order, the same on every node.
        for task in sorted(self.tasks, key=lambda t: t.state.task.key):
            self._add(task)

    def _add(self, task: TaskUnits) -> None:
        state = task.state
        adapter = state.library.adapter
        assert adapter is not None
        parts = _task_kernels(state.task)
        if parts is None:
            self._depends(task, [Unit(state.task.key, adapter, WorkKind.TASK, payload=task)])
            return
        have = {e.name for e in adapter.list_entries()}
        task.entries = [name for name, _sub in parts]
        self._depends(task, [self.units.get(name) or Unit(name, adapter, payload=sub)
                             for name, sub in parts if name not in have])

    def _depends(self, task: TaskUnits, units: list[Unit]) -> None:
        for unit in units:
            self.units.setdefault(unit.name, unit)
            self.by_unit.setdefault(unit.name, []).append(task)
        task.needs = {unit.name for unit in units}

    def ordered(self) -> list[Unit]:
        """The units in the order this node should claim them: the store's, so that nodes
        starting together start on different units."""
        return [self.units[n] for n in store_order(self.shared, list(self.units))]

    def ready_now(self) -> list[TaskUnits]:
        """Tasks with no unit to wait for (every entry here already)."""
        return [task for task in self.tasks if not task.needs]

    # -- the loop's callbacks --

    def build(self, unit: Unit, worker: Worker) -> Built:
        if unit.kind is WorkKind.TASK:
            return self._build_task(unit.payload, worker)  # type: ignore[arg-type]
        result = worker.run(unit.payload)  # type: ignore[arg-type]
        entry = next((e for e in unit.adapter.list_entries() if e.name == unit.name), None)
        if not result.ok or entry is None:
            return Built(False, result.seconds, result.error or f"{unit.name} not built")
        seconds = sum(k.seconds for k in result.kernels if k.outcome == Outcome.COMPILED)
        if self.shared is not None and not unit.local_only:
            self.shared.entries.publish_entries(unit.adapter, [entry], seconds)
        return Built(True, seconds or result.seconds)

    def _build_task(self, task: TaskUnits, worker: Worker) -> Built:
        state = task.state
        report = TaskReport(state.task, compile_task(worker, state), list(state.found or []))
        report = finish(self.run, state, report)
        if report.result.ok and self.shared is not None:
            publish(self.run, state, report)
        task.report = report
        return Built(report.result.ok, report.result.seconds, report.result.error or "")

    def install(self, adapter: CacheAdapter, units: list[Unit]) -> set[str]:
        assert self.shared is not None
        shared = self.shared
        present = set()
        entries = [u.name for u in units if u.kind is WorkKind.ENTRY]
        if entries:
            library = self._library_of(units)
            present |= set(library.installing(
                shared, lambda a: shared.entries.install_entries(a, entries)))
        for unit in (u for u in units if u.kind is WorkKind.TASK):
            task: TaskUnits = unit.payload  # type: ignore[assignment]
            if fetch(self.run, task.state).found:
                warm = check(self.run, task.state)
                if warm is not None:
                    task.report = finish(self.run, task.state, warm)
                    present.add(unit.name)
        return present

    def _library_of(self, units: list[Unit]):
        return next(t.state.library for u in units for t in self.by_unit[u.name])

    def unit_begun(self, unit: Unit) -> None:
        tell_building(self.run, self._build_of(unit), True)

    def _build_of(self, unit: Unit) -> Build:
        if unit.kind is WorkKind.TASK:
            state = unit.payload.state  # type: ignore[attr-defined]  # a TaskUnits
            return Build(unit.name, state.task.library, state.task)
        return Build(unit.name, self._library_of([unit]).name)

    def unit_done(self, unit: Unit, event: Event) -> None:
        if event.kind is not KernelEvent.INSTALLED:
            tell_building(self.run, self._build_of(unit), False)
        finished = []
        with self.lock:
            for task in self.by_unit[unit.name]:
                task.needs.discard(unit.name)
                if not task.needs:
                    finished.append(task)
        for task in finished:
            self.finish_task(task)

    # -- a task's report --

    def finish_task(self, task: TaskUnits) -> None:
        """The task's report from its units (or the left-over list when a task unit was
        published, yet its entries did not verify here)."""
        state = task.state
        if task.entries is None:  # a task unit
            report = task.report or self._failed(state)
            if report is None:
                with self.lock:
                    self.left_over.append(state)
                return
            self.done(report)
            return
        self.done(self._split_report(task.state, task.entries))

    def _failed(self, state: TaskState) -> TaskReport | None:
        """The report of a task unit whose build failed here (None: it did not)."""
        assert state.library.adapter is not None
        unit = self.run.events.derived().unit(state.library.adapter.library, WorkKind.TASK,
                                              state.task.key)
        if unit is None or unit.got is not KernelEvent.FAILED:
            return None
        return TaskReport(state.task, TaskResult(state.task.key, state.task.library, False,
                                                 unit.seconds, [], unit.error or "failed"))

    def _split_report(self, state: TaskState, entries: list[str]) -> TaskReport:
        """The task's entries named on the run's events: each one's outcome what its unit
        did (none: it was here before the run's units)."""
        began = time.monotonic()
        task = state.task
        kernels = name_kernels(state, [Naming(name) for name in entries])
        errors = self._errors(state, [k.name for k in kernels if k.outcome == Outcome.FAILED])
        seconds = round(time.monotonic() - began + sum(k.seconds for k in kernels), 3)
        result = TaskResult(task.key, task.library, not errors, seconds, kernels,
                            "; ".join(errors)[:600] or None)
        compiled = any(k.outcome == Outcome.COMPILED for k in kernels)
        mode = Mode.LIBRARY if compiled or errors else Mode.VERIFIED
        report = finish(self.run, state, TaskReport(task, result, list(state.found or []),
                                                    mode=mode), named=True)
        if report.result.ok and self.shared is not None:
            publish(self.run, state, report, 0.0)  # its entries are out already: the record
        return report

    def boot(self, timeline: LoopTimeline, began: float) -> BootReport:
        """What the units did of the cluster's work, as the run's events say; the loop's
        moments in seconds from ``began`` (the run's start)."""
        libraries = {a.library for t in self.tasks if (a := t.state.library.adapter)}
        units = self.run.events.derived().of(libraries, [WorkKind.ENTRY, WorkKind.TASK])
        return boot(units, {
            "claims_began": round(timeline.began - began, 3),
            **{k: None if v is None else round(v + timeline.began - began, 3)
               for k, v in timeline.to_json().items()}})

    def _errors(self, state: TaskState, failed: list[str]) -> list[str]:
        """Why each of these entries' units failed here."""
        if not failed:
            return []
        assert state.library.adapter is not None
        derived, library = self.run.events.derived(), state.library.adapter.library
        units = [derived.unit(library, WorkKind.ENTRY, name) for name in failed]
        return [f"{name}: {unit.error if unit is not None else ''}"
                for name, unit in zip(failed, units, strict=True)]


def run_units(run: RunState, states: list[TaskState], workers: list[Worker],
              done: Done) -> tuple[TaskWork, ClaimLoop]:
    """Run the units of these cold tasks on this node's workers (one claim thread each);
    each task's report goes to done as its last unit is. Returns the work (its left-over
    tasks still need their library) and the loop (its timeline)."""
    work = TaskWork(run, states, done)
    loop: ClaimLoop[Worker] = ClaimLoop(run.shared, workers, work.build, work.install,
                                        run.events, done=work.unit_done, begun=work.unit_begun,
                                        wait_limit=run.options.single_flight_timeout)
    for task in work.ready_now():
        work.finish_task(task)
    loop.add(work.ordered())
    loop.close()
    loop.run()
    return work, loop
