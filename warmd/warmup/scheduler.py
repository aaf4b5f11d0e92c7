"""The run: prefetch the plan from the shared cache, check each task once, start workers
only for what is cold; with a shared cache, the cold tasks' units of cluster work are
claimed, built or installed (warmd.warmup.units); the tasks left are handed out to worker
threads (warmd.warmup.task runs each)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from warmd.coordination import BootReport
from warmd.executors.pool import Worker, stop_workers
from warmd.plan import Plan
from warmd.stats import Counters, Outcome
from warmd.tasks import Task
from warmd.warmup.options import WarmupOptions
from warmd.warmup.report import TaskReport, WarmupReport, count, store_counters, store_health
from warmd.warmup.state import Building, RunState, StoreAnswer, TaskState
from warmd.warmup.task import check, run_task
from warmd.warmup.units import run_units, splits
from warmd.warmup.workers import start_workers

if TYPE_CHECKING:
    from warmd.store.api import SharedCache

Progress = Callable[[TaskReport, int, int], None]  # (finished task, done, total)
Started = Callable[[Task], None]  # a worker starts this task (fetch or build)

log = logging.getLogger(__name__)


def run_warmup(plan: Plan, options: WarmupOptions, shared: SharedCache | None = None,
               progress: Progress | None = None, started: Started | None = None,
               building: Building | None = None) -> WarmupReport:
    """Run the plan's selected tasks; Ctrl-C stops the workers (and their compilers) and
    returns what finished, with ``interrupted`` set. ``started`` hears of each task as a
    worker takes it, ``progress`` as it finishes (both from worker threads).

    Worker processes start only for tasks that need their library; a plan whose every task
    is verified warm starts none (and looks for no GPU). With ``warm_only`` a plan that has
    such tasks runs nothing and lists them in ``not_warm`` (what the shared cache had is
    installed by then)."""
    began = time.monotonic()
    options = options.for_plan(plan)
    phases = _Phases()
    tasks = options.select(plan.tasks)
    run = RunState(plan, options, shared, tasks, building)
    order = _prefetch(run)
    phases.mark("prefetch")
    for state in run.tasks:
        state.warm = check(run, state)
    phases.mark("check")
    cold = [s.task for s in run.tasks if not s.settled]
    if options.warm_only and cold:
        return WarmupReport(plan.key, len(tasks), [], Counters(), time.monotonic() - began,
                            shared=shared is not None, not_warm=[t.key for t in cold])
    handout = _Handout(run, progress, started)
    workers: list[Worker] = []
    interrupted = False
    boot = BootReport()
    try:
        workers = start_workers(run, cold)
        phases.mark("workers")
        split = [s for s in order if not s.settled and splits(s)] if shared is not None else []
        if split:
            work, loop = run_units(run, split, workers, handout.add_report)
            boot = work.boot(loop.timeline, began)
            order = [s for s in order if s not in split] + work.left_over
        handout.run(workers, order)
    except KeyboardInterrupt:
        interrupted = True
        handout.stop.set()
        stop_workers(workers, kill=True)
        for stage in run.stages():
            stage.stop()
    finally:
        stop_workers(workers)
        stages = [stage.finish() for stage in run.stages()]
        phases.mark("work")
    counters = count(handout.reports)
    if shared is not None:
        # stats are best effort; the store counts its own failures
        with contextlib.suppress(Exception):
            shared.stats.record_outcomes(counters.to_json())
        with contextlib.suppress(Exception):
            shared.stats.record_compile_times(compile_times(handout.reports))
        counters.add(store_counters(shared))
    reports = sorted(handout.reports, key=lambda r: r.task.key)
    for stage in stages:
        if stage.cluster is not None:
            boot.add_stage(stage.cluster.boot, stage.library)
    return WarmupReport(plan.key, len(tasks), reports, counters, time.monotonic() - began,
                        interrupted, shared is not None,
                        store_health(shared) if shared is not None else None,
                        dict(shared.stats.counters) if shared is not None else {},
                        sum(w.started for w in workers) + sum(
                            s.workers_started for s in stages), stages,
                        boot=boot if shared is not None else None, phases=phases.seconds)


def family(task: Task) -> str:
    """The kernel family whose past compile times estimate this task's."""
    return f"{task.library}/{task.kernel}"


def compile_times(reports: list[TaskReport]) -> dict[str, tuple[int, float]]:
    """(tasks, seconds) compiled per family in this run (tasks that compiled something)."""
    out: dict[str, tuple[int, float]] = {}
    for report in reports:
        seconds = sum(k.seconds for k in report.result.kernels if k.outcome == Outcome.COMPILED)
        if seconds > 0:
            count, total = out.get(family(report.task), (0, 0.0))
            out[family(report.task)] = (count + 1, total + seconds)
    return out


def estimate(shared: SharedCache | None, tasks: list[Task]) -> tuple[float, int]:
    """(seconds of compiling the tasks would take if all were cold, from the cluster's
    history; how many of the tasks have a history)."""
    if shared is None or not tasks:
        return 0.0, 0
    try:
        means = shared.stats.compile_times(sorted({family(t) for t in tasks}))
    except Exception:  # only an estimate
        return 0.0, 0
    known = [means[family(t)] for t in tasks if family(t) in means]
    return sum(known), len(known)


class _Phases:
    """Wall seconds of each phase of a run, each from the end of the one before."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now


def _prefetch(run: RunState) -> list[TaskState]:
    """Prefetch the whole plan from the shared cache (each task's answer), then the order
    this node should start in."""
    shared = run.shared
    if shared is None:
        return list(run.tasks)
    for library in run.libraries.values():
        mine = [s for s in run.tasks if s.library is library]
        if library.adapter is None or not mine:
            continue
        keys = [s.task.key for s in mine]
        try:
            found = library.installing(
                shared, lambda adapter, keys=keys: shared.entries.prefetch(adapter, keys))
        except Exception as exc:  # per-task fetches retry; the store counts faults
            log.warning("shared cache prefetch for %s failed: %s", library.name, exc)
            continue
        for state in mine:
            entries = found.get(state.task.key)
            state.answer = StoreAnswer(tuple(entries) if entries is not None else None)
    by_key = {s.task.key: s for s in run.tasks}
    try:
        order = shared.claims.shard_order(list(by_key))
    except Exception:  # ordering is an optimisation; never fail the warmup for it
        return list(run.tasks)
    return [by_key[k] for k in order if k in by_key] + \
        [s for s in run.tasks if s.task.key not in set(order)]


class _Handout:
    """Hands the tasks out, in order, to one thread per worker; collects every task's
    report (those the units made too), telling progress of each."""

    def __init__(self, run: RunState, progress: Progress | None,
                 started: Started | None) -> None:
        self.run_state, self.progress, self.started = run, progress, started
        self.total = len(run.tasks)
        self.pending: queue.Queue[TaskState] = queue.Queue()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.reports: list[TaskReport] = []

    def add_report(self, report: TaskReport) -> None:
        with self.lock:
            self.reports.append(report)
            done = len(self.reports)
        _notify(self.progress, report, done, self.total)

    def run(self, workers: list[Worker], order: list[TaskState]) -> None:
        for state in order:
            self.pending.put(state)
        threads = [threading.Thread(target=self._loop, args=(w,), daemon=True)
                   for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)

    def _loop(self, worker: Worker) -> None:
        while not self.stop.is_set():
            try:
                state = self.pending.get_nowait()
            except queue.Empty:
                return
            _notify(self.started, state.task)
            self.add_report(run_task(self.run_state, state, worker))


def _notify(callback, *args) -> None:
    if callback is not None:
        try:
            callback(*args)
        except Exception:  # a display problem must not drop this worker's tasks
            log.exception("progress callback failed")
