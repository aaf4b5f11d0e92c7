"""Run a plan's JIT tasks locally, sharing results through the cluster cache when given one.

Per task: ``shared.fetch_task`` installs what the cluster already has; on a miss,
``shared.single_flight`` lets one node compile while the others wait and fetch; the task
always runs through its library's executor (in a worker process), so what is counted is
what the library did; a task that succeeded where the cluster had no record is published.
Kernels are counted per entry: compiled, local hit, remote hit (installed from the shared
cache in this run and then used without compiling), or failed.

A small record per task, ``<cache root>/.warmd/tasks/<sha256 of task key>.json``, lists the
entries a task produced and what each took to compile, so later runs count them as hits
(and the compile time they saved) even when an executor only reports what it compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from warmd import settings
from warmd.cache.base import CacheAdapter
from warmd.errors import WarmdInputError
from warmd.executors.base import KernelOutcome, TaskResult
from warmd.executors.pool import Worker, failed_result
from warmd.plan import Plan, Task
from warmd.stats import BY_OUTCOME, Counters, F, ids

if TYPE_CHECKING:  # the interface only: warming without a store imports no store client
    from warmd.store.api import SharedCache

RECORD_DIR = ".warmd/tasks"
STORE_COUNTERS = ids(F.RUN | F.STORE)  # what warmup reports from the store's counters

log = logging.getLogger(__name__)


@dataclass
class WarmupOptions:
    libraries: tuple[str, ...] = ()  # empty: every library of the plan
    task_filter: str | None = None  # regex searched in task keys
    workers: int | None = None  # None: one per GPU, else 1
    gpu_ids: tuple[str, ...] | None = None  # None: the visible GPUs
    # library -> the cache root its workers compile into; missing: the engine's (settings)
    cache_roots: dict[str, Path] = field(default_factory=dict)
    single_flight_timeout: float = 3600.0

    def __post_init__(self) -> None:
        from warmd.libraries import LIBRARIES

        self.cache_roots = {**{name: lib.root.default() for name, lib in LIBRARIES.items()},
                            **{name: Path(root) for name, root in self.cache_roots.items()}}

    def select(self, tasks: tuple[Task, ...]) -> list[Task]:
        try:
            pattern = re.compile(self.task_filter) if self.task_filter else None
        except re.error as exc:
            raise WarmdInputError(f"invalid --task-filter regex {self.task_filter!r}: "
                                  f"{exc}") from None
        return [t for t in tasks
                if (not self.libraries or t.library in self.libraries)
                and (pattern is None or pattern.search(t.key))]


@dataclass
class TaskReport:
    task: Task
    result: TaskResult
    fetched: list[str] = field(default_factory=list)
    published: bool = False
    recorded: dict[str, float] = field(default_factory=dict)  # compile seconds on record

    def to_json(self) -> dict:
        return {"key": self.task.key, "library": self.task.library, "ok": self.result.ok,
                "seconds": round(self.result.seconds, 3), "error": self.result.error,
                "fetched": self.fetched, "published": self.published,
                "kernels": [{"name": k.name, "outcome": k.outcome,
                             "seconds": round(k.seconds, 3)} for k in self.result.kernels]}


@dataclass
class WarmupReport:
    plan_key: str
    selected: int
    reports: list[TaskReport]
    counters: Counters
    seconds: float
    interrupted: bool = False
    shared: bool = False
    store: dict | None = None  # store_health() and counters of the shared cache, or None

    @property
    def failed(self) -> list[TaskReport]:
        return [r for r in self.reports if not r.result.ok]

    def to_json(self) -> dict:
        c = self.counters
        return {
            "plan_key": self.plan_key,
            "tasks": len(self.reports),
            "tasks_selected": self.selected,
            "tasks_failed": len(self.failed),
            "kernels": c.kernel_counts(),
            "hit_rate": round(c.hit_rate, 4),
            "seconds": round(self.seconds, 3),
            "compile_seconds": round(c.compile_seconds, 3),
            "compile_seconds_saved": round(c.compile_seconds_saved, 3),
            "interrupted": self.interrupted,
            "shared": self.shared,
            "store": self.store,
            "task_details": [r.to_json() for r in self.reports],
        }


Progress = Callable[[TaskReport, int, int], None]  # (finished task, done, total)
Started = Callable[[Task], None]  # a worker starts this task (fetch or build)


# ----- local task records -----

def _record_path(root: Path, task_key: str) -> Path:
    return root / RECORD_DIR / f"{hashlib.sha256(task_key.encode()).hexdigest()}.json"


def read_task_record(root: Path, task_key: str) -> dict[str, float]:
    """entry name -> compile seconds, as recorded by the last successful run of the task."""
    try:
        data = json.loads(_record_path(root, task_key).read_text())
        return {str(k): float(v) for k, v in data.get("entries", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):  # missing or damaged: no record
        return {}


def write_task_record(root: Path, task_key: str, entries: dict[str, float]) -> bool:
    """Write the record atomically; False (logged) when the disk refuses: a record only
    improves later counts, so it never fails the task."""
    path = _record_path(root, task_key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as handle:
            json.dump({"task": task_key, "entries": entries}, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("cannot write the task record %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


# ----- adapters and worker environments -----

def make_adapter(library: str, plan: Plan, options: WarmupOptions) -> CacheAdapter | None:
    """The parent's view of a library's cache (for records and the shared cache); None when
    the library or its adapter is not installed here."""
    from warmd.libraries import LIBRARIES, resolve

    registered = LIBRARIES.get(library)
    if registered is None:
        return None
    module = registered.adapter.partition(":")[0]
    try:
        factory = resolve(registered.adapter)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None  # this warmd has no adapter for it
    return factory(options.cache_roots[library], plan.env.target.arch)


def worker_env(plan: Plan, options: WarmupOptions, libraries: set[str]) -> dict[str, str]:
    """Every library's cache root, and what the libraries of these tasks need set before
    they are imported (FlashInfer: its arch, a stub libcuda...)."""
    from warmd.libraries import LIBRARIES, resolve

    env = {}
    for name, registered in LIBRARIES.items():
        env[registered.root.env] = str(options.cache_roots[name])
        if name in libraries and registered.worker_env:
            env.update(resolve(registered.worker_env)(plan.env.target.arch,
                                                      options.cache_roots[name]))
    return env


def _local_gpus():
    from warmd.targets import detect_local_gpus

    return detect_local_gpus()


def gpu_ids(options: WarmupOptions) -> list[str]:
    if options.gpu_ids is not None:
        return list(options.gpu_ids)
    visible = settings.visible_devices()
    total = sum(g.count for g in _local_gpus())
    if visible is not None:
        return [p.strip() for p in visible.split(",") if p.strip()][:total]
    return [str(i) for i in range(total)]


# ----- the run -----

class _Run:
    def __init__(self, plan: Plan, options: WarmupOptions, shared: SharedCache | None,
                 progress: Progress | None, tasks: list[Task],
                 started: Started | None = None) -> None:
        self.plan, self.options, self.shared, self.progress = plan, options, shared, progress
        self.started = started
        self.tasks = tasks
        self.adapters = {lib: make_adapter(lib, plan, options) for lib in {t.library
                                                                            for t in tasks}}
        # Entries installed from the shared cache during this run: remote hits, not local.
        self.remote: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.reports: list[TaskReport] = []
        self.stop = threading.Event()
        self.pending: queue.Queue[Task] = queue.Queue()
        for task in self._ordered(tasks):
            self.pending.put(task)

    def _ordered(self, tasks: list[Task]) -> list[Task]:
        """Prefetch the whole plan from the shared cache, then start where this node should."""
        if self.shared is None:
            return tasks
        for library, adapter in self.adapters.items():
            keys = [t.key for t in tasks if t.library == library]
            if adapter is None or not keys:
                continue
            try:
                self._fetch(adapter, lambda a, keys=keys: self.shared.prefetch(a, keys))
            except Exception as exc:  # per-task fetches below retry; the store counts faults
                log.warning("shared cache prefetch for %s failed: %s", library, exc)
        by_key = {t.key: t for t in tasks}
        try:
            order = self.shared.shard_order(list(by_key))
        except Exception:  # ordering is an optimisation; never fail the warmup for it
            return tasks
        return [by_key[k] for k in order if k in by_key] + \
            [t for t in tasks if t.key not in set(order)]

    def _fetch(self, adapter: CacheAdapter, fetch):
        """Run a fetch, remembering which entries it newly installed (remote hits)."""
        before = {e.name for e in adapter.list_entries()}
        result = fetch(adapter)
        new = {e.name for e in adapter.list_entries()} - before
        with self.lock:
            self.remote.update((adapter.library, name) for name in new)
        return result

    def worker_loop(self, worker: Worker) -> None:
        while not self.stop.is_set():
            try:
                task = self.pending.get_nowait()
            except queue.Empty:
                return
            self._notify(self.started, task)
            report = self.run_task(worker, task)
            with self.lock:
                self.reports.append(report)
                done = len(self.reports)
            self._notify(self.progress, report, done, len(self.tasks))

    @staticmethod
    def _notify(callback, *args) -> None:
        if callback is not None:
            try:
                callback(*args)
            except Exception:  # a display problem must not drop this worker's tasks
                log.exception("progress callback failed")

    def run_task(self, worker: Worker, task: Task) -> TaskReport:
        adapter = self.adapters.get(task.library)
        try:
            return self._run_shared(worker, task, adapter)
        except Exception as exc:  # a broken shared cache must not stop the warmup
            return TaskReport(task, failed_result(task, f"{type(exc).__name__}: {exc}"))

    def _run_shared(self, worker: Worker, task: Task, adapter: CacheAdapter | None
                    ) -> TaskReport:
        shared = self.shared if adapter is not None else None
        if shared is None:
            return self._finish(TaskReport(task, worker.run(task)), adapter)
        fetched = self._fetch(adapter, lambda a: shared.fetch_task(a, task.key))
        if fetched is not None:
            return self._finish(TaskReport(task, worker.run(task), list(fetched)), adapter)
        with shared.single_flight(task.key, self.options.single_flight_timeout) as mine:
            if not mine:
                fetched = self._fetch(adapter, lambda a: shared.fetch_task(a, task.key))
            report = TaskReport(task, worker.run(task), list(fetched or []))
            report = self._finish(report, adapter)
            if report.result.ok and fetched is None:
                self._publish(report, adapter)
        return report

    def _publish(self, report: TaskReport, adapter: CacheAdapter) -> None:
        names = {k.name for k in report.result.kernels if k.outcome != "failed"}
        entries = [e for e in adapter.list_entries() if e.name in names]
        seconds = sum(k.seconds for k in report.result.kernels if k.outcome == "compiled")
        assert self.shared is not None
        self.shared.publish_task(adapter, report.task.key, entries, seconds)
        report.published = bool(entries)

    def _finish(self, report: TaskReport, adapter: CacheAdapter | None) -> TaskReport:
        """Relabel fetched entries as remote hits, add recorded entries the executor did not
        mention, and record what the task produced."""
        result = report.result
        if adapter is None:
            return report
        recorded = read_task_record(adapter.root, report.task.key)
        with self.lock:
            fetched = {name for lib, name in self.remote if lib == adapter.library}
        seen = {k.name for k in result.kernels}
        for k in result.kernels:
            if k.outcome == "local_hit" and k.name in fetched:
                k.outcome = "remote_hit"
        unseen = set(recorded) - seen
        present = {e.name for e in adapter.list_entries()} if unseen and result.ok else set()
        for name in sorted(unseen & present):
            outcome = "remote_hit" if name in fetched else "local_hit"
            result.kernels.append(KernelOutcome(name, outcome))
        if result.ok:
            entries = {k.name: k.seconds if k.outcome == "compiled"
                       else recorded.get(k.name, 0.0) for k in result.kernels}
            write_task_record(adapter.root, report.task.key, entries)
        report.recorded = recorded
        return report

    def counters(self) -> Counters:
        counters = Counters(tasks=len(self.reports))
        for report in self.reports:
            recorded = report.recorded
            counters.tasks_failed += 0 if report.result.ok else 1
            for k in report.result.kernels:
                if k.outcome == "compiled":
                    counters.compiled += 1
                    counters.compile_seconds += k.seconds
                elif k.outcome in BY_OUTCOME and BY_OUTCOME[k.outcome].has(F.HIT):
                    counters.add({BY_OUTCOME[k.outcome].id: 1,
                                  "compile_seconds_saved": recorded.get(k.name, 0.0)})
                else:
                    counters.failed += 1
        return counters


def run_warmup(plan: Plan, options: WarmupOptions, shared: SharedCache | None = None,
               progress: Progress | None = None, started: Started | None = None
               ) -> WarmupReport:
    """Run the plan's selected tasks; Ctrl-C stops the workers (and their compilers) and
    returns what finished, with ``interrupted`` set. ``started`` hears of each task as a
    worker takes it, ``progress`` as it finishes (both from worker threads)."""
    began = time.monotonic()
    tasks = options.select(plan.tasks)
    run = _Run(plan, options, shared, progress, tasks, started)
    ids = gpu_ids(options)
    count = max(1, min(options.workers or len(ids) or 1, len(tasks) or 1))
    env = worker_env(plan, options, {t.library for t in tasks}) if tasks else {}
    workers = [Worker(_gpu_env(env, ids, i)) for i in range(count)]
    threads = [threading.Thread(target=run.worker_loop, args=(w,), daemon=True)
               for w in workers]
    interrupted = False
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        interrupted = True
        run.stop.set()
        for w in workers:
            w.stop(kill=True)
        for t in threads:
            t.join(timeout=10)
    finally:
        for w in workers:
            w.stop()
    counters = run.counters()
    if shared is not None:
        # stats are best effort; the store counts its own failures
        with contextlib.suppress(Exception):
            shared.record_outcomes(counters.to_json())
        counters.add(_store_counters(shared))
    reports = sorted(run.reports, key=lambda r: r.task.key)
    return WarmupReport(plan.key, len(tasks), reports, counters, time.monotonic() - began,
                        interrupted, shared is not None,
                        {**store_health(shared), "counters": shared.counters}
                        if shared is not None else None)


def store_health(shared: SharedCache) -> dict:
    """{"ok", "reason", "url"} of a shared cache after a run: the store's health as every
    report gives it (URL without credentials; reason says what failed and why)."""
    if shared.disabled_reason:
        return {"ok": False, "url": None,
                "reason": f"shared cache disabled: {shared.disabled_reason}"}
    url = shared.display_url
    counts = shared.counters
    trouble = {k: int(counts[k]) for k in ids(F.TROUBLE) if counts.get(k)}
    if not trouble:
        return {"ok": True, "url": url, "reason": ""}
    what = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in trouble.items())
    unreachable = any(k in trouble for k in ids(F.TROUBLE | F.DOWN))
    last = shared.last_error
    why = ("unreachable" if unreachable else "refused work") + (f": {last}" if last else "")
    return {"ok": False, "url": url,
            "reason": f"shared cache {url or ''} {why} ({what}); kernels were built locally"}


def _store_counters(shared: SharedCache) -> dict:
    """What only the store can count (bytes moved, entries refused)."""
    counts = shared.counters
    return {k: counts[k] for k in STORE_COUNTERS if k in counts}


def _gpu_env(env: dict[str, str], ids: list[str], index: int) -> dict[str, str]:
    if not ids:
        return env
    return {**env, "CUDA_VISIBLE_DEVICES": ids[index % len(ids)]}
