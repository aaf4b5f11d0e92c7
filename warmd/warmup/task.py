"""One task through the warm path, step by step, each step saying what it did:

    check    its entries, verified here, make it warm without a library  -> TaskReport | None
    fetch    the shared cache installs what the cluster has               -> StoreAnswer
    flight   one node compiles what the cluster lacks, the others wait    -> bool (mine)
    compile  its library runs it in a worker process                      -> TaskResult
    finish   its kernels named on the run's events, outcomes read, recorded -> TaskReport
    record   this node's record of the task written                       -> Recorded
    publish  what it produced shared with the cluster                     -> int (entries)
"""

from __future__ import annotations

import enum
import logging
import time

from warmd.cache.base import CacheEntry
from warmd.cache.records import LocalTaskRecord, entry_digest, write_record
from warmd.executors.base import KernelOutcome, TaskResult
from warmd.executors.pool import Worker, failed_result
from warmd.stats import Outcome
from warmd.warmup.events import Naming
from warmd.warmup.report import Mode, TaskReport
from warmd.warmup.state import RunState, StoreAnswer, TaskState

log = logging.getLogger(__name__)


class Recorded(enum.Enum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"  # verified against this very record: nothing new to write
    REFUSED = "refused"  # the disk refused (logged); a record only improves later counts


def check(run: RunState, state: TaskState) -> TaskReport | None:
    """The task's report from its entries alone, when every entry it needs is complete
    here and verified: installed from the shared cache in this run (the store checked its
    digest and fingerprint), or on this node's record of the task with the same digest and
    fingerprint. None: the library has to run it."""
    adapter = state.library.adapter
    if adapter is None or run.options.verify_load:
        return None
    began = time.monotonic()
    found = state.found
    names = set(found or state.record.entries)
    if not names:
        return None
    complete = {e.name: e for e in adapter.list_entries()}
    if not names <= set(complete):
        return None
    installed = state.library.installed()
    if not all(_vouched(state, name, complete[name]) for name in sorted(names - installed)):
        return None
    # found here; which of them the store installed, the run's events say (finish)
    kernels = [KernelOutcome(n, Outcome.LOCAL_HIT) for n in sorted(names)]
    task = state.task
    result = TaskResult(task.key, task.library, True, round(time.monotonic() - began, 3),
                        kernels)
    return TaskReport(task, result, list(found or []), mode=Mode.VERIFIED)


def _vouched(state: TaskState, name: str, entry: CacheEntry) -> bool:
    """Whether the task's record vouches for this entry here (hashed once per run)."""
    if name not in state.vouched:
        state.vouched[name] = state.record.vouches_for({name: entry},
                                                       state.library.fingerprint())
    return state.vouched[name]


def fetch(run: RunState, state: TaskState) -> StoreAnswer:
    """Install what the shared cache has of the task."""
    assert run.shared is not None
    shared = run.shared
    found = state.library.installing(shared, lambda adapter: shared.entries.fetch_task(adapter,
                                                                       state.task.key))
    state.answer = StoreAnswer(tuple(found) if found is not None else None)
    return state.answer


def compile_task(worker: Worker, state: TaskState) -> TaskResult:
    """The task run through its library in a worker process."""
    return worker.run(state.task)


def run_task(run: RunState, state: TaskState, worker: Worker) -> TaskReport:
    """The task through every step it needs; never raises (a broken shared cache must not
    stop the warmup: the task fails with the reason)."""
    try:
        return _steps(run, state, worker)
    except Exception as exc:
        return TaskReport(state.task, failed_result(state.task, f"{type(exc).__name__}: {exc}"))


def _steps(run: RunState, state: TaskState, worker: Worker) -> TaskReport:
    if state.warm is not None:
        report = finish(run, state, state.warm)
        if state.store_lacks and state.library.adapter is not None:
            publish(run, state, report, sum(report.recorded.values()))
        return report
    stage = state.library.stage
    if state.found is None and run.shared is not None and stage is not None:
        names = stage.task_entries(state.task.key)
        if names is not None:
            return from_stage(run, state, names)
    if state.found is None and run.options.builder and _needs_stage(state.task.library):
        return TaskReport(state.task, TaskResult(state.task.key, state.task.library, True,
                                                 0.0, []))  # no kernel list: not built here
    if state.library.adapter is None or run.shared is None:
        return finish(run, state, TaskReport(state.task, compile_task(worker, state)))
    if state.found is None and fetch(run, state).found:
        warm = check(run, state)
        if warm is not None:
            return finish(run, state, warm)
    if state.found is not None:
        report = TaskReport(state.task, compile_task(worker, state), list(state.found))
        return finish(run, state, report)
    with run.shared.claims.single_flight(state.task.key, run.options.single_flight_timeout) as mine:
        if not mine and fetch(run, state).found:
            warm = check(run, state)
            if warm is not None:
                return finish(run, state, warm)
        report = TaskReport(state.task, compile_task(worker, state), list(state.found or []))
        report = finish(run, state, report)
        if report.result.ok and state.found is None:
            publish(run, state, report)
    return report


def from_stage(run: RunState, state: TaskState, names: list[str]) -> TaskReport:
    """The report of a task whose every entry its library's kernel stage built here or
    installed from the cluster (the cluster's kernel list names them): no worker runs it.
    Each is counted as finish counts a stage's kernels; its record is then published."""
    task = state.task
    began = time.monotonic()
    kernels = [KernelOutcome(name, Outcome.LOCAL_HIT) for name in names]
    result = TaskResult(task.key, task.library, True, 0.0, kernels)
    report = finish(run, state, TaskReport(task, result, list(state.found or [])))
    compiled = any(k.outcome == Outcome.COMPILED for k in result.kernels)
    report.mode = Mode.LIBRARY if compiled else Mode.VERIFIED
    result.seconds = round(time.monotonic() - began, 3)
    if run.shared is not None:
        publish(run, state, report, 0.0)  # its entries are out already: the record
    return report


def _needs_stage(library: str) -> bool:
    """Whether a builder builds this library's tasks only from a kernel list (a library
    whose tasks run on a GPU, with a kernel stage that can build from a list)."""
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(library)
    return registered is not None and registered.plugin().stages_kernels


def finish(run: RunState, state: TaskState, report: TaskReport,
           named: bool = False) -> TaskReport:
    """Name the task's kernels on the run's events (and the complete entries its record
    has that its library did not mention), each one's outcome what the events say, and
    record what the task produced. ``named``: its kernels are named already."""
    library, result = state.library, report.result
    adapter = library.adapter
    if adapter is None:
        return report
    recorded = dict(state.record.entries)
    installed = library.installed()
    seen = {k.name for k in result.kernels}
    if run.shared is not None:  # installed from the store this run: what a hit saved
        for name in (seen & installed) - set(recorded):  # is its manifest's compile time
            seconds = run.shared.entries.installed_seconds(library.name, name)
            if seconds is not None:
                recorded[name] = seconds
    complete = {e.name: e for e in adapter.list_entries()} if result.ok else {}
    unseen = set() if report.mode == Mode.VERIFIED else set(recorded) - seen
    names = [] if named else [Naming(k.name, k.outcome, k.seconds) for k in result.kernels]
    names += [Naming(name, Outcome.LOCAL_HIT) for name in sorted(unseen & set(complete))]
    kernels = name_kernels(state, names)
    result.kernels = (result.kernels + kernels) if named else kernels
    if result.ok:
        record(state, report, recorded, complete)
    report.recorded = recorded
    report.own = state.record.compiled
    return report


def name_kernels(state: TaskState, names: list[Naming]) -> list[KernelOutcome]:
    """The task names these kernels on the run's events: their outcomes. With a kernel
    stage, what it compiled of them is on the events first (nvcc's time each)."""
    library = state.library
    assert library.adapter is not None
    stage, name = library.stage, library.adapter.library
    if stage is not None:
        for n in names:
            seconds = stage.compile_seconds(n.name)
            if seconds is not None:
                library.events.compiled(name, n.name, seconds)
    return library.events.name(state.task.key, name, names, staged=stage is not None)


def record(state: TaskState, report: TaskReport, recorded: dict[str, float],
           complete: dict[str, CacheEntry]) -> Recorded:
    """Write this node's record of what the task produced (entries, compile seconds, their
    digests, the fingerprint), unless it would say what the record already says."""
    adapter = state.library.adapter
    assert adapter is not None
    entries = {k.name: k.seconds if k.outcome == Outcome.COMPILED else recorded.get(k.name, 0.0)
               for k in report.result.kernels}
    fingerprint = state.library.fingerprint()
    old = state.record
    if (report.mode == Mode.VERIFIED and old.fingerprint == fingerprint
            and set(old.digests) >= set(entries)):
        return Recorded.UNCHANGED
    digests = {name: d for name in entries if name in complete
               and (d := entry_digest(complete[name].path)) is not None}
    compiled = frozenset(k.name for k in report.result.kernels
                         if k.outcome == Outcome.COMPILED
                         or (k.outcome == Outcome.LOCAL_HIT and k.name in old.compiled))
    written = write_record(adapter.root, LocalTaskRecord(state.task.key, entries, digests,
                                                         fingerprint, compiled))
    return Recorded.WRITTEN if written else Recorded.REFUSED


def publish(run: RunState, state: TaskState, report: TaskReport,
            seconds: float | None = None) -> int:
    """Share the entries the task produced (all but failed ones); how many were offered."""
    adapter = state.library.adapter
    assert run.shared is not None and adapter is not None
    names = {k.name for k in report.result.kernels if k.outcome != Outcome.FAILED}
    entries = [e for e in adapter.list_entries() if e.name in names]
    if seconds is None:
        seconds = sum(k.seconds for k in report.result.kernels
                      if k.outcome == Outcome.COMPILED)
    run.shared.entries.publish_task(adapter, report.task.key, entries, seconds)
    report.published = bool(entries)
    return len(entries)
