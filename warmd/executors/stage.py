"""The machinery of a kernel stage (warmd.executors.base.KernelStage), for any library whose
kernels a *discovery* can name before they are compiled: discovery processes (worker
processes running the library's recorder executor over pieces of the cold tasks), a pool
of compile slots, the child processes it starts, when the library's own workers may start
(worker gating), how the stage is stopped, and its timeline. A library's stage
(DeepGEMM's: warmd.libraries.deep_gemm.compiler) adds what is its own: how a kernel is
recorded, named and built (its shim and job format), and its report's own fields.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from warmd import settings
from warmd.executors.base import DiscoveryRun, StageCluster, TaskResult
from warmd.executors.pool import Worker, stop_workers
from warmd.tasks import Task

# At most: a plan of many kernels, or a discovery that never ends, holds no one longer.
WORKERS_HELD_SECONDS = 60.0


class CompileStage:
    """See the module docstring. ``recorder``: the discovery processes' executor
    ("module:Class"); ``fast_path_off``: why the discovery compiles instead of recording
    (None while it records)."""

    library: str = ""
    recorder: str = ""

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str], cluster: StageCluster | None = None,
                 timeout: float | None = None) -> None:
        self.root = Path(root)
        self.timeout = timeout  # the longest a discovery piece or a compile runs
        self.cluster = cluster  # with a shared cache: kernels claimed and listed cluster-wide
        self.tasks = list(tasks)
        self.jobs = max(1, jobs)
        self.gpu_ids = list(gpu_ids)
        self.env = dict(env)
        # The library's scratch directory: same filesystem, never read as entries.
        self.run = self.root / "tmp" / f"warmd-{uuid.uuid4().hex[:12]}"
        self.pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="warmd-compile")
        self.futures: dict[str, Future] = {}
        self.procs: set[subprocess.Popen] = set()
        self.recorders: list[Worker] = []
        self.recorder_env: dict[str, str] = {}
        self.record_errors: list[str] = []
        self.discovery_seconds: dict[str, float] = {}  # entry -> its discovery call time
        self.pending: queue.Queue[Task] = queue.Queue()
        self.discovering = 0  # discovery threads still running
        self.fast_path_off: str | None = None
        self.began = self.discovered_at = self.began_wall = 0.0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.stopped = threading.Event()
        self.discovery_done = threading.Event()
        self.cluster_done = threading.Event()
        self.discovery_run: DiscoveryRun | None = None
        # Set once discovery has ended and every kernel it named is compiling: the
        # library's workers start then, in the last wave's idle cores, instead of taking
        # CPU from the discovery's start-up and the compiles (their own start-up, torch
        # and CUDA, is the same seconds either way, and they only hand over cubins).
        self.workers_may_start = threading.Event()
        self.all_submitted = False  # the discovery ended and its last jobs are in the pool

    # -- threads, processes --

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _started(self, proc: subprocess.Popen) -> None:
        """A child process (a compiler) started: stopped with the stage."""
        with self.lock:
            self.procs.add(proc)
            stopping = self.stopped.is_set()
        if stopping:
            terminate(proc)

    # -- the discovery on this node --

    def _discover_tasks(self, tasks: list[Task]) -> None:
        """Start the discovery of these tasks, and the thread that follows it."""
        # Cut for the fallback's processes: the fast path's few take the pieces in turn.
        for unit in discovery_units(tasks, self.jobs):
            self.pending.put(unit)
        self._add_discovery(self._discovery_processes())
        self._thread(self._watch)

    def _watch(self) -> None:
        """Follow the discovery until it ends (the library's)."""
        raise NotImplementedError

    def _discovery_processes(self) -> int:
        """WARMD_DISCOVERY_PROCESSES record (at most one per two compile jobs); without the
        fast path, one per compile job compiles."""
        if self.fast_path_off is None:
            return max(1, min(settings.discovery_processes(self.env), self.jobs // 2))
        return self.jobs

    def _add_discovery(self, total: int) -> None:
        """Start discovery processes until total run, or each has a piece of work."""
        with self.lock:
            count = min(total - len(self.recorders), self.pending.qsize())
        started = [self._new_recorder() for _ in range(max(0, count))]
        for worker in started:
            self._thread(self._discover, worker, self.pending)

    def _new_recorder(self) -> Worker:
        """One more discovery process (on the node's GPUs in turn)."""
        with self.lock:
            env = dict(self.recorder_env)
            if self.gpu_ids:
                env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids[len(self.recorders)
                                                           % len(self.gpu_ids)]
            worker = Worker(env, executors={self.library: self.recorder},
                            timeout=self.timeout)
            self.recorders.append(worker)
            self.discovering += 1
        return worker

    def _discover(self, worker: Worker, pending: queue.Queue[Task]) -> None:
        while not self.stopped.is_set():
            try:
                task = pending.get_nowait()
            except queue.Empty:
                break
            self._record(worker, task)
        worker.stop()
        with self.lock:
            self.discovering -= 1
            if self.discovering == 0:
                self.discovered_at = time.monotonic()
                self.discovery_done.set()

    def _record(self, worker: Worker, task: Task) -> TaskResult:
        """Run a piece of discovery on a discovery process; what it named is noted."""
        result = worker.run(task)
        with self.lock:
            for kernel in result.kernels:
                if kernel.outcome == "compiled":
                    self.discovery_seconds.setdefault(kernel.name, kernel.seconds)
            if not result.ok:  # what it missed, the workers compile when they get there
                self.record_errors.append(f"{task.key}: {result.error}")
        return result

    def _task_of(self, unit_key: str) -> str:
        """The task a discovery unit (a task, or an M range of one) belongs to."""
        return next((t.key for t in self.tasks if unit_key == t.key
                     or unit_key.startswith(f"{t.key}@m")), unit_key)

    # -- worker gating --

    def _release_workers_if_due(self) -> None:
        """Let the workers start once no job waits in the pool for its compiler."""
        with self.lock:
            if not self.all_submitted:  # futures is final only from then on
                return
        if all(f.running() or f.done() for f in list(self.futures.values())):
            self.workers_may_start.set()

    def hold_workers(self, timeout: float = WORKERS_HELD_SECONDS) -> None:
        """Return once the library's workers should start: when discovery has ended and
        every kernel it named is compiling (or after timeout)."""
        self.workers_may_start.wait(timeout)

    # -- ending --

    def stop(self) -> None:
        self.stopped.set()
        if self.discovery_run is not None:
            self.discovery_run.stop()
        self.discovery_done.set()
        self.cluster_done.set()
        self.workers_may_start.set()
        stop_workers(self.recorders, kill=True)
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            terminate(proc)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _join(self) -> None:
        """Wait for the stage's threads, its compiles and its discovery processes."""
        for thread in self.threads:
            thread.join()
        self.pool.shutdown(wait=True, cancel_futures=self.stopped.is_set())
        stop_workers(self.recorders)


def discovery_units(tasks: list[Task], count: int) -> list[Task]:
    """Fewer tasks than ``count`` discovery processes: each task cut into pieces of
    consecutive M values (at least two each), so that every process finds kernels at once.
    A library picks a kernel config from M (with the shape), so pieces of distinct M ranges
    mostly find distinct kernels."""
    per_task = -(-count // max(1, len(tasks)))
    units = []
    for task in tasks:
        pieces = max(1, min(per_task, len(task.m) // 2))
        units += m_pieces(task, -(-len(task.m) // pieces))
    return units


def m_pieces(task: Task, size: int) -> list[Task]:
    """The task cut into pieces of at most size consecutive M values, each keyed
    ``<task key>@m<first>-<last>`` (the task itself when it has no more)."""
    values = sorted(task.m)
    if len(values) <= size:
        return [task]
    return [replace(task, key=f"{task.key}@m{chunk[0]}-{chunk[-1]}", m=tuple(chunk))
            for i in range(0, len(values), size) if (chunk := values[i:i + size])]


def stage_timeline(began: float, known: list[float], recorders: list[dict],
                   compiles: list[dict], slots: int) -> dict:
    """Where a stage's time went, in seconds from its start (wall clock ``began``): each
    discovery process's start-up (``recorders``: its phases' moments and when its pieces
    were done), when kernels became known, when the compiler ran (``compiles``: each
    run's ``began`` and ``seconds``), and how busy the slots were."""
    def at(moment: float | None) -> float | None:
        return None if moment is None else round(moment - began, 2)

    starts = [c["began"] for c in compiles if "began" in c]
    ends = [c["began"] + c["seconds"] for c in compiles if "began" in c]
    span = (max(ends) - min(starts)) if starts else 0.0
    discovery = [{name: at(moment) for name, moment in r.items()} for r in recorders]
    return {
        "discovery": sorted(discovery, key=lambda r: r.get("imported") or 0.0),
        "kernels_known": [at(q) for q in _quartiles(known)],  # min, 25%, median, 75%, max
        "nvcc_began": [at(q) for q in _quartiles(starts)],
        "last_nvcc_end": at(max(ends, default=None)),
        "slots_busy": round(sum(c["seconds"] for c in compiles) / (slots * span), 3)
        if span else None,
    }


def _quartiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    if not ordered:
        return []
    return [ordered[round(q * (len(ordered) - 1))] for q in (0, 0.25, 0.5, 0.75, 1)]


def terminate(proc: subprocess.Popen) -> None:
    """Stop a compiler the stage started, with its own children (cicc, ptxas): it leads its
    own process group."""
    with contextlib.suppress(ProcessLookupError, OSError):
        os.killpg(proc.pid, signal.SIGTERM)
