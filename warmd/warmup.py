"""Run a plan's JIT tasks locally, sharing results through the cluster cache when given one.

Per task: a task whose every entry is here and verified (installed from the shared cache
in this run, or complete on disk with this node's record of the task and its digests)
finishes without a library: no worker process starts and no torch is imported (mode
"verified"); ``verify_load`` replays it through the library instead. Otherwise
``shared.fetch_task`` installs what the cluster already has; on a miss,
``shared.single_flight`` lets one node compile while the others wait and fetch; the task
then runs through its library's executor (in a worker process), so what is counted is what
the library did (mode "library"); a task that succeeded where the cluster had no record is
published. Kernels are counted per entry: compiled, local hit, remote hit (installed from
the shared cache in this run), or failed.

A library may split its cold tasks below the task (``Library.kernel_stage``): DeepGEMM
finds the distinct kernels a plan needs and compiles each once, on every core.

A small record per task, ``<cache root>/.warmd/tasks/<sha256 of task key>.json``, lists the
entries a task produced, what each took to compile, each entry's digest and the digest of
the library's fingerprint inputs, so later runs count them as hits (and the compile time
they saved) without running the library.
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
from warmd.cache.base import RECORD_DIR, CacheAdapter, CacheEntry
from warmd.errors import WarmdInputError
from warmd.executors.base import KernelOutcome, KernelStage, TaskResult
from warmd.executors.pool import Worker, failed_result
from warmd.plan import Plan, Task
from warmd.stats import BY_OUTCOME, CounterFlag, Counters, ids

if TYPE_CHECKING:  # the interface only: warming without a store imports no store client
    from warmd.store.api import SharedCache

GPU_WORKERS_PER_GPU = 4  # processes sharing one GPU (each holds a CUDA context and inputs)
GIB_PER_COMPILE = 2  # memory one nvcc or ninja job may take
# How a task's hits were counted: from verified entries alone, or by running its library.
VERIFIED, LIBRARY = "verified", "library"
# what warmup reports from the store's counters
STORE_COUNTERS = ids(CounterFlag.RUN | CounterFlag.STORE)

log = logging.getLogger(__name__)


@dataclass
class WarmupOptions:
    libraries: tuple[str, ...] = ()  # empty: every library of the plan
    task_filter: str | None = None  # regex searched in task keys
    workers: int | None = None  # compile jobs at once; None: default_workers()
    gpu_ids: tuple[str, ...] | None = None  # None: the visible GPUs
    # library -> the cache root its workers compile into; missing: the engine's (settings)
    cache_roots: dict[str, Path] = field(default_factory=dict)
    single_flight_timeout: float = 3600.0
    verify_load: bool = False  # replay warm tasks through the library (loads every kernel)
    kernel_split: bool = True  # let libraries split cold tasks below the task
    warm_only: bool = False  # finish only if no task needs a library; else run nothing

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
    mode: str = LIBRARY  # VERIFIED: counted from verified entries, no library ran

    def to_json(self) -> dict:
        return {"key": self.task.key, "library": self.task.library, "ok": self.result.ok,
                "seconds": round(self.result.seconds, 3), "error": self.result.error,
                "fetched": self.fetched, "published": self.published, "mode": self.mode,
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
    workers: int = 0  # worker processes started
    stages: list[dict] = field(default_factory=list)  # what kernel stages did
    not_warm: list[str] = field(default_factory=list)  # warm_only: tasks left to a library

    def hits_by_mode(self) -> dict[str, int]:
        """Hits counted from verified entries alone, and by running the library."""
        counts = {VERIFIED: 0, LIBRARY: 0}
        for report in self.reports:
            counts[report.mode] += sum(k.outcome in ("local_hit", "remote_hit")
                                       for k in report.result.kernels)
        return counts

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
            "hits_by_mode": self.hits_by_mode(),
            "not_warm": self.not_warm,
            "workers_started": self.workers,
            "kernel_stages": self.stages,
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


def read_record(root: Path, task_key: str) -> dict:
    """The task's record as written (entries, digests, fingerprint); {} when missing or
    damaged."""
    try:
        data = json.loads(_record_path(root, task_key).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_task_record(root: Path, task_key: str) -> dict[str, float]:
    """entry name -> compile seconds, as recorded by the last successful run of the task."""
    try:
        entries = read_record(root, task_key).get("entries", {})
        return {str(k): float(v) for k, v in entries.items()}
    except (ValueError, TypeError, AttributeError):  # damaged: no record
        return {}


def write_task_record(root: Path, task_key: str, entries: dict[str, float],
                      digests: dict[str, str] | None = None,
                      fingerprint: str | None = None) -> bool:
    """Write the record atomically; False (logged) when the disk refuses: a record only
    improves later counts, so it never fails the task."""
    path = _record_path(root, task_key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    record = {"task": task_key, "entries": entries, "digests": digests or {},
              "fingerprint": fingerprint}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as handle:
            json.dump(record, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("cannot write the task record %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def entry_digest(path: Path) -> str | None:
    """sha256 over an entry's regular files (relative path and bytes, in name order);
    None when it holds anything else or cannot be read."""
    digest = hashlib.sha256()
    try:
        files = sorted(p for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
        for file in files:
            if file.is_symlink() or not file.is_file():
                return None
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
            digest.update(file.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()


def fingerprint_digest(adapter: CacheAdapter) -> str | None:
    """Digest of what the adapter says its cache keys depend on (library version, install
    path, arch...): entries recorded under another one may not hit here."""
    try:
        inputs = adapter.fingerprint_inputs()
    except Exception as exc:  # a probe that fails: nothing on record can be trusted
        log.warning("cannot work out the %s fingerprint: %s", adapter.library, exc)
        return None
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


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
    visible = settings.visible_gpu_ids()
    total = sum(g.count for g in _local_gpus())
    if visible is not None:
        return list(visible[:total])
    return [str(i) for i in range(total)]


def default_workers(gpus: int, cpus: int | None = None,
                    memory_bytes: int | None = None) -> int:
    """Compile jobs at once on this node: one per core (nvcc and ninja are CPU-bound), at
    most one per GIB_PER_COMPILE of memory, at least one per GPU."""
    if cpus is None:
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    memory_bytes = memory_bytes or _memory_bytes()
    by_memory = max(1, memory_bytes // (GIB_PER_COMPILE << 30)) if memory_bytes else cpus
    return max(1, gpus, min(cpus, by_memory))


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


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
        # task key -> entry names the shared cache installed for it (None: a miss)
        self.fetched: dict[str, list[str] | None] = {}
        self.prefetched: set[str] = set()  # libraries whose prefetch answered
        self.fingerprints: dict[str, str | None] = {}
        self.compiled: set[tuple[str, str]] = set()  # (library, entry) compiled in this run
        self.stages: dict[str, KernelStage] = {}  # library -> its kernel stage, if one runs
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
                found = self._fetch(adapter, lambda a, keys=keys: self.shared.prefetch(a, keys))
                self.fetched.update({k: v for k, v in found.items() if v is not None})
                self.prefetched.add(library)
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

    def _fetch_task(self, adapter: CacheAdapter, task: Task) -> list[str] | None:
        assert self.shared is not None
        fetched = self._fetch(adapter, lambda a: self.shared.fetch_task(a, task.key))
        if fetched is not None:
            with self.lock:
                self.fetched[task.key] = list(fetched)
        return fetched

    # -- the warm path: verified entries, no library --

    def fingerprint(self, adapter: CacheAdapter) -> str | None:
        with self.lock:
            if adapter.library in self.fingerprints:
                return self.fingerprints[adapter.library]
        digest = fingerprint_digest(adapter)
        with self.lock:
            self.fingerprints[adapter.library] = digest
        return digest

    def verified(self, task: Task, adapter: CacheAdapter | None) -> TaskReport | None:
        """The task's report from its entries alone, when every entry it needs is complete
        here and verified: installed from the shared cache in this run (the store checked
        its digest and fingerprint), or on this node's record of the task with the same
        digest and fingerprint. None: the library has to run it."""
        if adapter is None or self.options.verify_load:
            return None
        began = time.monotonic()
        record = read_record(adapter.root, task.key)
        with self.lock:
            fetched = self.fetched.get(task.key)
            remote = {name for lib, name in self.remote if lib == adapter.library}
        recorded = record.get("entries")
        names = set(fetched or (recorded if isinstance(recorded, dict) else ()))
        if not names:
            return None
        complete = {e.name: e for e in adapter.list_entries()}
        if not names <= set(complete):
            return None
        local = names - remote
        if local and not self._on_record(adapter, record, {n: complete[n] for n in local}):
            return None
        kernels = [KernelOutcome(n, "remote_hit" if n in remote else "local_hit")
                   for n in sorted(names)]
        result = TaskResult(task.key, task.library, True,
                            round(time.monotonic() - began, 3), kernels)
        return TaskReport(task, result, list(fetched or []), mode=VERIFIED)

    def _on_record(self, adapter: CacheAdapter, record: dict,
                   entries: dict[str, CacheEntry]) -> bool:
        """Whether every entry matches this node's record: same fingerprint, same bytes."""
        digests = record.get("digests")
        if not isinstance(digests, dict) or record.get("fingerprint") is None:
            return False
        if record["fingerprint"] != self.fingerprint(adapter):
            return False
        return all(digests.get(name) is not None and digests[name] == entry_digest(e.path)
                   for name, e in entries.items())

    def settled(self, task: Task) -> bool:
        """Whether the task needs no compile here: verified, or installed by the prefetch."""
        adapter = self.adapters.get(task.library)
        with self.lock:
            fetched = task.key in self.fetched
        return fetched or self.verified(task, adapter) is not None

    # -- the tasks --

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

    @staticmethod
    def _ran(worker: Worker, task: Task) -> TaskResult:
        """The task run through its library in a worker process."""
        return worker.run(task)

    def run_task(self, worker: Worker, task: Task) -> TaskReport:
        adapter = self.adapters.get(task.library)
        try:
            return self._run_shared(worker, task, adapter)
        except Exception as exc:  # a broken shared cache must not stop the warmup
            return TaskReport(task, failed_result(task, f"{type(exc).__name__}: {exc}"))

    def _run_shared(self, worker: Worker, task: Task, adapter: CacheAdapter | None
                    ) -> TaskReport:
        warm = self.verified(task, adapter)
        if warm is not None:
            warm = self._finish(warm, adapter)
            if self._store_lacks(task) and adapter is not None:
                self._publish(warm, adapter, sum(warm.recorded.values()))
            return warm
        shared = self.shared if adapter is not None else None
        if shared is None:
            return self._finish(TaskReport(task, self._ran(worker, task)), adapter)
        with self.lock:
            fetched = self.fetched.get(task.key)
        if fetched is None:
            fetched = self._fetch_task(adapter, task)
            warm = self.verified(task, adapter) if fetched is not None else None
            if warm is not None:
                return self._finish(warm, adapter)
        if fetched is not None:
            return self._finish(TaskReport(task, self._ran(worker, task), list(fetched)),
                                adapter)
        with shared.single_flight(task.key, self.options.single_flight_timeout) as mine:
            if not mine:
                fetched = self._fetch_task(adapter, task)
                warm = self.verified(task, adapter) if fetched is not None else None
                if warm is not None:
                    return self._finish(warm, adapter)
            report = TaskReport(task, self._ran(worker, task), list(fetched or []))
            report = self._finish(report, adapter)
            if report.result.ok and fetched is None:
                self._publish(report, adapter)
        return report

    def _store_lacks(self, task: Task) -> bool:
        """Whether the shared cache answered this run's prefetch without this task: a node
        warm from its own disk then shares what it has."""
        with self.lock:
            return task.library in self.prefetched and task.key not in self.fetched

    def _publish(self, report: TaskReport, adapter: CacheAdapter,
                 seconds: float | None = None) -> None:
        names = {k.name for k in report.result.kernels if k.outcome != "failed"}
        entries = [e for e in adapter.list_entries() if e.name in names]
        if seconds is None:
            seconds = sum(k.seconds for k in report.result.kernels if k.outcome == "compiled")
        assert self.shared is not None
        self.shared.publish_task(adapter, report.task.key, entries, seconds)
        report.published = bool(entries)

    def _finish(self, report: TaskReport, adapter: CacheAdapter | None) -> TaskReport:
        """Relabel fetched entries as remote hits, add recorded entries the executor did not
        mention, take compile times from a kernel stage, and record what the task
        produced."""
        result = report.result
        if adapter is None:
            return report
        record = read_record(adapter.root, report.task.key)
        recorded = read_task_record(adapter.root, report.task.key)
        with self.lock:
            fetched = {name for lib, name in self.remote if lib == adapter.library}
            stage = self.stages.get(adapter.library)
        seen = {k.name for k in result.kernels}
        if self.shared is not None:  # installed from the store this run: what a hit saved
            for name in (seen & fetched) - set(recorded):  # is its manifest's compile time
                seconds = self.shared.installed_seconds(adapter.library, name)
                if seconds is not None:
                    recorded[name] = seconds
        for k in result.kernels:
            if k.outcome == "local_hit" and k.name in fetched:
                k.outcome = "remote_hit"
        complete = {e.name: e for e in adapter.list_entries()} if result.ok else {}
        unseen = set() if report.mode == VERIFIED else set(recorded) - seen
        for name in sorted(unseen & set(complete)):
            outcome = "remote_hit" if name in fetched else "local_hit"
            result.kernels.append(KernelOutcome(name, outcome))
        if stage is not None:
            self._stage_times(stage, adapter.library, result)
        if result.ok:
            self._record(report, adapter, record, recorded, complete)
        report.recorded = recorded
        return report

    def _stage_times(self, stage: KernelStage, library: str, result: TaskResult) -> None:
        """With a kernel stage each kernel's nvcc ran once on the node (its jobs are
        claimed), so a second task that loaded it while it compiled waited, and counts a
        local hit; a compile's time is nvcc's, not the wait of the call."""
        for k in result.kernels:
            if k.outcome != "compiled":
                continue
            with self.lock:
                first = (library, k.name) not in self.compiled
                self.compiled.add((library, k.name))
            if not first:
                k.outcome, k.seconds = "local_hit", 0.0
                continue
            seconds = stage.compile_seconds(k.name)
            if seconds is not None:
                k.seconds = seconds

    def _record(self, report: TaskReport, adapter: CacheAdapter, record: dict,
                recorded: dict[str, float], complete: dict[str, CacheEntry]) -> None:
        result = report.result
        entries = {k.name: k.seconds if k.outcome == "compiled" else recorded.get(k.name, 0.0)
                   for k in result.kernels}
        fingerprint = self.fingerprint(adapter)
        if (report.mode == VERIFIED and record.get("fingerprint") == fingerprint
                and set(record.get("digests") or {}) >= set(entries)):
            return  # verified against this very record: nothing new to write
        digests = {name: d for name in entries if name in complete
                   and (d := entry_digest(complete[name].path)) is not None}
        write_task_record(adapter.root, report.task.key, entries, digests, fingerprint)

    def counters(self) -> Counters:
        counters = Counters(tasks=len(self.reports))
        for report in self.reports:
            recorded = report.recorded
            counters.tasks_failed += 0 if report.result.ok else 1
            if report.mode == VERIFIED:
                counters.verify_seconds += report.result.seconds
            for k in report.result.kernels:
                if k.outcome == "compiled":
                    counters.compiled += 1
                    counters.compile_seconds += k.seconds
                elif k.outcome in BY_OUTCOME and BY_OUTCOME[k.outcome].has(CounterFlag.HIT):
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
    worker takes it, ``progress`` as it finishes (both from worker threads).

    Worker processes start only for tasks that need their library; a plan whose every task
    is verified warm starts none (and looks for no GPU). With ``warm_only`` a plan that has
    such tasks runs nothing and lists them in ``not_warm`` (what the shared cache had is
    installed by then)."""
    began = time.monotonic()
    tasks = options.select(plan.tasks)
    run = _Run(plan, options, shared, progress, tasks, started)
    cold = [t for t in tasks if not run.settled(t)]
    if options.warm_only and cold:
        return WarmupReport(plan.key, len(tasks), [], Counters(), time.monotonic() - began,
                            shared=shared is not None, not_warm=[t.key for t in cold])
    workers: list[Worker] = []
    interrupted = False
    try:
        workers = _start_cold_work(run, cold)
        threads = [threading.Thread(target=run.worker_loop, args=(w,), daemon=True)
                   for w in workers]
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
        for stage in run.stages.values():
            stage.stop()
    finally:
        for w in workers:
            w.stop()
        stages = [stage.finish() for stage in run.stages.values()]
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
                        if shared is not None else None,
                        sum(w.started for w in workers) + sum(
                            s.get("workers_started", 0) for s in stages), stages)


def _start_cold_work(run: _Run, cold: list[Task]) -> list[Worker]:
    """The workers for the run (their processes start on their first task), after starting
    the kernel stages of the cold tasks' libraries. Without cold tasks: one worker, which
    starts only should a verified task turn out otherwise, and no GPU lookup."""
    if not cold:
        return [Worker(lambda: worker_env(run.plan, run.options, set()))]
    options = run.options
    ids = gpu_ids(options)
    jobs = options.workers or default_workers(len(ids))
    count = worker_count(jobs, len(cold), len(ids))
    libraries = {t.library for t in run.tasks}
    extra = _start_stages(run, cold, jobs, ids) if options.kernel_split else {}
    per_build = str(max(1, jobs // count))
    shared_env: list[dict[str, str]] = []  # worked out once, when the first worker starts
    lock = threading.Lock()

    def env_for(index: int) -> Callable[[], dict[str, str]]:
        def make() -> dict[str, str]:
            for stage in list(run.stages.values()):
                stage.hold_workers()  # until its compiles need no more CPU than they have
            with lock:
                if not shared_env:
                    env = {**worker_env(run.plan, options, libraries), **extra}
                    if not settings.is_set("MAX_JOBS"):
                        env["MAX_JOBS"] = per_build  # ninja's own -j, sharing the cores
                    shared_env.append(env)
            return _gpu_env(shared_env[0], ids, index)
        return make

    return [Worker(env_for(i)) for i in range(count)]


def worker_count(jobs: int, cold: int, gpus: int) -> int:
    """Worker processes for a run: one per cold task (a verified task needs none, and
    each worker's ninja gets jobs // count of the cores), at most one per compile job and
    GPU_WORKERS_PER_GPU per GPU."""
    count = max(1, min(jobs, cold))
    return min(count, GPU_WORKERS_PER_GPU * gpus) if gpus else count


def _start_stages(run: _Run, cold: list[Task], jobs: int, ids: list[str]) -> dict[str, str]:
    """Start the kernel stage of each library that has one; the environment its library's
    workers need while it runs."""
    from warmd.libraries import LIBRARIES, resolve

    extra: dict[str, str] = {}
    for library in sorted({t.library for t in cold}):
        registered = LIBRARIES.get(library)
        adapter = run.adapters.get(library)
        if registered is None or registered.kernel_stage is None or adapter is None:
            continue
        tasks = [t for t in cold if t.library == library]
        base = worker_env(run.plan, run.options, {library})
        try:
            stage = resolve(registered.kernel_stage)(adapter.root, tasks, jobs, ids, base)
            extra.update(stage.start())
        except WarmdInputError:
            raise  # a setting of the user's is wrong: said in one line, not worked around
        except Exception as exc:  # the tasks then compile per task, as without a stage
            log.warning("%s kernel stage did not start: %s", library, exc)
            continue
        with run.lock:
            run.stages[library] = stage
    return extra


def store_health(shared: SharedCache) -> dict:
    """{"ok", "reason", "url"} of a shared cache after a run: the store's health as every
    report gives it (URL without credentials; reason says what failed and why)."""
    if shared.disabled_reason:
        return {"ok": False, "url": None,
                "reason": f"shared cache disabled: {shared.disabled_reason}"}
    url = shared.display_url
    counts = shared.counters
    trouble = {k: int(counts[k]) for k in ids(CounterFlag.TROUBLE) if counts.get(k)}
    if not trouble:
        return {"ok": True, "url": url, "reason": ""}
    what = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in trouble.items())
    unreachable = any(k in trouble for k in ids(CounterFlag.TROUBLE | CounterFlag.DOWN))
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
