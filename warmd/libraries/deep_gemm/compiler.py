"""DeepGEMM's kernel stage: each distinct kernel a plan needs, compiled once on the node,
on every core, before and while the workers run the tasks.

A task is one GEMM shape and its M values; DeepGEMM's heuristics pick a kernel config per
call, and many calls (and shapes: dense kernels are shape-agnostic) share one kernel.
Running tasks in parallel therefore compiles at most one kernel per task at a time, and
the same kernel in several tasks at once. The stage instead:

1. runs the cold tasks' GEMMs once in a *discovery* pass: real DeepGEMM on the GPU, with
   a throw-away cache root seeded with this node's entries and ``nvcc_shim`` in record
   mode as its compiler, so every kernel DeepGEMM asks for is saved as a job (its exact
   source and nvcc arguments) and answered with a placeholder in milliseconds;
2. compiles the jobs as they appear, ``jobs`` at once, with the real nvcc (each job once:
   ``compile_job`` claims it);
3. meanwhile the warmup's workers run every task as usual, into the real cache root, with
   the shim in build mode as DeepGEMM's compiler: a kernel whose job is compiled (or
   being compiled) is handed over (or waited for), one the discovery missed is claimed and
   compiled there. DeepGEMM itself names and writes every entry, so the keys are the ones
   a plain DeepGEMM computes, and the workers' accounting stays what DeepGEMM did.

That is the fast path. It needs a DeepGEMM whose compiler calls the shim can record
(install.py: a known generation, nvcc rather than NVRTC). When it cannot run (an unknown
version up front; during the run, DeepGEMM compiling kernels itself in the discovery: its
nvcc call in a form the shim does not know, or ``DG_JIT_NVCC_COMPILER`` not honoured), the
stage says why in one line on stderr and in its report, and compiles with every core
anyway: as many discovery processes as compile jobs (at most one per M range of the
tasks), each running DeepGEMM with its own compiler into the throw-away root; every real
entry that appears there is linked into the real cache root at once, and the workers then
find it.

This module imports neither torch nor deep_gemm: the discovery runs in worker processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import rename_noreplace
from warmd.executors.base import StageCluster
from warmd.executors.pool import Worker
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.install import (
    KNOWN_VERSIONS,
    DeepGemmInstall,
    Generation,
    nvrtc_on,
    resolve,
)
from warmd.libraries.deep_gemm.listed import (
    BadListing,
    ListedJob,
    build_entry,
    listed_from_entry,
    set_digest,
    task_digest,
)
from warmd.libraries.deep_gemm.nvcc_shim import (
    BUILD,
    RECORD,
    Job,
    build_placeholder,
    compile_job,
    make_slots,
    read_compiles,
    read_passthrough,
    set_compile_nice,
    write_shim,
)
from warmd.tasks import Task

RECORDER = "warmd.libraries.deep_gemm.executor:DeepGemmRecorder"
# Discovery processes on the node (at most one per two compile jobs). Few: processes that
# import torch at once slow each other down (on the H200 node one took 3.6 s alone, eight
# with four workers 6.3-7.3 s each), and one process names about 17 kernels a second once
# started, faster than any node compiles them.
RECORDERS = 2
POLL_SECONDS = 0.05
# At most: a plan of many kernels, or a discovery that never ends, holds no one longer.
WORKERS_HELD_SECONDS = 60.0
# A builder waits this long at most for GPU nodes to publish the kernel lists of its tasks.
BUILDER_WAIT_SECONDS = 120.0

log = logging.getLogger(__name__)


def real_nvcc() -> str:
    """The compiler DeepGEMM would run: DG_JIT_NVCC_COMPILER, else CUDA_HOME's nvcc."""
    chosen = settings.deep_gemm_nvcc()
    return str(chosen) if chosen else str(settings.cuda_home() / "bin" / "nvcc")


def seed_entries(source: DeepGemmCacheAdapter, target: Path) -> set[str]:
    """Hard-link (else copy) every complete entry of source into target's cache/, so the
    discovery pass asks only for kernels this node lacks; the names linked."""
    names = set()
    for entry in source.list_entries():
        _link_files(entry.path, target / "cache" / entry.name)
        names.add(entry.name)
    return names


def _link_files(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        try:
            os.link(file, dest / file.name)
        except OSError:
            shutil.copy2(file, dest / file.name)


def link_entry(source: Path, root: Path, scratch: Path) -> bool:
    """Make the complete entry at source an entry of root's cache/ too, all at once: its
    files linked into a directory under scratch (root's filesystem) renamed into place.
    False when root has it already (nothing changed)."""
    dest = root / "cache" / source.name
    if dest.exists():
        return False
    staged = scratch / f"link-{uuid.uuid4().hex[:8]}" / source.name
    try:
        _link_files(source, staged)
        dest.parent.mkdir(parents=True, exist_ok=True)
        return rename_noreplace(staged, dest)
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)


def fast_path_problem(found: DeepGemmInstall | None, key_env: dict[str, str]) -> str | None:
    """Why the recording shim cannot be used with this DeepGEMM, or None."""
    if found is None:
        return None  # nothing to warm: the tasks fail with the probe's reason
    if found.generation is None:
        return (f"{found.describe()} is a version warmd does not know (known: "
                f"{KNOWN_VERSIONS}): its nvcc calls are not recorded")
    if found.generation is Generation.NVCC_JIT and nvrtc_on(key_env.get("DG_JIT_USE_NVRTC")):
        return "DG_JIT_USE_NVRTC is set: DeepGEMM compiles in-process with NVRTC, not nvcc"
    return None


class DeepGemmKernelStage:
    """See the module docstring; a warmd.executors.base.KernelStage."""

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str], cluster: StageCluster | None = None) -> None:
        self.root = Path(root)
        self.cluster = cluster  # with a shared cache: kernels claimed and listed cluster-wide
        self.listed: dict[str, ListedJob] = {}  # entry -> how it is built (the kernel list)
        self.task_lists: dict[str, tuple[str, ...]] = {}  # task key -> its entries, listed
        self.found_by_task: dict[str, set[str]] = {}  # task key -> entries its discovery named
        self.cluster_report: dict | None = None
        self.cluster_done = threading.Event()
        self.kernel_list_source = ""  # "read", "discovered here", or why none
        self.tasks = list(tasks)
        self.jobs = max(1, jobs)
        self.gpu_ids = list(gpu_ids)
        self.env = dict(env)
        self.nvcc = real_nvcc()
        self.nice = settings.compile_nice()
        # DeepGEMM's own scratch directory: same filesystem, never read as entries.
        self.run = self.root / "tmp" / f"warmd-{uuid.uuid4().hex[:12]}"
        self.pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="dg-nvcc")
        self.futures: dict[str, Future] = {}
        self.procs: set[subprocess.Popen] = set()
        self.recorders: list[Worker] = []
        self.record_errors: list[str] = []
        self.began = self.discovered_at = 0.0
        self.began_wall = 0.0
        self.stopped = threading.Event()
        self.discovery_done = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.discovering = 0  # discovery threads still running
        # Set once discovery has ended and every kernel it named is compiling: the
        # library's workers start then, in the last wave's idle cores, instead of taking
        # CPU from the discovery's start-up and the compiles (their own start-up, torch
        # and CUDA, is the same seconds either way, and they only hand over cubins).
        self.workers_may_start = threading.Event()
        self.all_submitted = False  # the discovery ended and its last jobs are in the pool
        self.install = resolve()  # the DeepGEMM the workers import
        self.fast_path_off: str | None = None  # why the fast path is not running
        self.pending: queue.Queue[Task] = queue.Queue()
        self.recorder_env: dict[str, str] = {}
        self.seeded: set[str] = set()
        self.placeholder_entries: set[str] = set()  # recorded, never published
        self.linked: set[str] = set()  # real entries of the discovery, linked into root
        self.discovery_seconds: dict[str, float] = {}  # entry -> its discovery call time
        self.built_here: set[str] = set()  # listed kernels this node built (claimed)

    # -- starting --

    def start(self) -> dict[str, str]:
        if not Path(self.nvcc).is_file():
            raise RuntimeError(f"nvcc not found at {self.nvcc}")
        self.began, self.began_wall = time.monotonic(), time.time()
        problem = fast_path_problem(self.install, settings.deep_gemm_key_env())
        if problem:
            self._fast_path_lost(problem)
        if problem or self.cluster is None:
            self.cluster = None
            self.cluster_done.set()
        try:
            return self._start()
        except BaseException:
            self.stop()
            shutil.rmtree(self.run, ignore_errors=True)
            raise

    def _start(self) -> dict[str, str]:
        (self.run / "jobs").mkdir(parents=True)
        make_slots(self.run, self.jobs)  # the pool's and the workers' compiles together
        set_compile_nice(self.run, self.nice)
        recording = self.fast_path_off is None
        arch = local_arch_flag()
        if arch and recording:  # ready before the first recorded kernel asks for it
            self._thread(self._build_placeholder, arch)
        record_root = self.run / "record"
        self.seeded = seed_entries(DeepGemmCacheAdapter(self.root), record_root)
        self.recorder_env = {**self.env, "DG_JIT_CACHE_DIR": str(record_root)}
        if recording:
            self.recorder_env["DG_JIT_NVCC_COMPILER"] = str(write_shim(self.run, RECORD,
                                                                       self.nvcc))
        if self.cluster is not None:
            self._thread(self._cluster_work)
        else:
            self._discover_tasks(self.tasks)
        if not recording:
            return {}
        return {"DG_JIT_NVCC_COMPILER": str(write_shim(self.run, BUILD, self.nvcc))}

    def _discover_tasks(self, tasks: list[Task]) -> None:
        """Start the discovery of these tasks, and the thread that follows it."""
        # Cut for the fallback's processes: the fast path's few take the pieces in turn.
        for unit in discovery_units(tasks, self.jobs):
            self.pending.put(unit)
        self._add_discovery(self._discovery_processes())
        self._thread(self._watch)

    # -- the cluster's share: kernel lists and claims (with a shared cache) --

    def _cluster_work(self) -> None:
        """Read the cluster's kernel lists of these tasks; discover the tasks nobody listed
        (once in the cluster: claimed), listing what was found; build each listed kernel
        this node lacks by claiming it cluster-wide (or install it when another node did).
        A builder only follows lists."""
        cluster = self.cluster
        assert cluster is not None
        began = time.monotonic()
        self.cluster_moments: dict[str, float] = {}
        digests = {t.key: task_digest(t) for t in self.tasks}
        kernels = cluster.run_kernels(self._build_listed, self.jobs)
        try:
            missing = self._take_lists(digests, kernels)
            if missing is None:
                self._cluster_lost(kernels)
                return
            self.cluster_moments["lists_read"] = time.monotonic()
            if missing and not cluster.builder:
                self._discover_missing(missing, digests, kernels)
            elif missing:
                self._builder_waits(missing, digests, kernels)
            if not self.kernel_list_source:
                self.kernel_list_source = "read"
        finally:
            kernels.close()
            report = kernels.join()
            self.cluster_report = {**report, "library": "deep_gemm",
                                   "kernel_list": self.kernel_list_source,
                                   "timeline": {**report.get("timeline", {}), **{
                                       k: round(v - began, 3)
                                       for k, v in self.cluster_moments.items()}}}
            self.cluster_done.set()
            self.discovery_done.set()
            self.workers_may_start.set()

    def _take_lists(self, digests: dict[str, str], kernels) -> list[Task] | None:
        """Take what the cluster listed of these tasks; the tasks still unlisted (None: a
        list was refused here: none is used)."""
        assert self.cluster is not None
        wanted = [d for key, d in digests.items() if key not in self.task_lists]
        listing = self.cluster.kernel_list(wanted)
        if listing.refused:
            self.kernel_list_source = f"refused: {listing.refused}"
            return None
        by_digest = {d: key for key, d in digests.items()}
        fresh = []
        for digest, entries in listing.tasks.items():
            try:
                jobs = [ListedJob.from_json(listing.jobs[n]) for n in entries]
            except BadListing as exc:
                self.kernel_list_source = f"refused: {exc}"
                return None
            self.task_lists[by_digest[digest]] = tuple(entries)
            for job in jobs:
                if job.entry not in self.listed:
                    self.listed[job.entry] = job
                    fresh.append(job.entry)
        kernels.add([n for n in fresh if not (self.root / "cache" / n).exists()])
        return [t for t in self.tasks if t.key not in self.task_lists]

    def _discover_missing(self, missing: list[Task], digests: dict[str, str], kernels) -> None:
        """Discover the unlisted tasks here once the cluster says nobody else is (the
        claim on their discovery), listing what was found; or take the list another
        node publishes meanwhile."""
        assert self.cluster is not None
        digest = set_digest([digests[t.key] for t in missing])
        deadline = time.monotonic() + self.cluster.wait_limit
        while not self.stopped.is_set():
            if time.monotonic() >= deadline:  # held past the single-flight timeout
                log.warning("the discovery of %d DeepGEMM task(s) was held by another node "
                            "for %.0f s; discovering them here", len(missing),
                            self.cluster.wait_limit)
                self._discover_and_list(missing, digest, kernels)
                return
            state = self.cluster.claim_discovery(digest)
            if state == "mine":
                self.cluster_moments["discovery_claimed"] = time.monotonic()
                try:
                    self._discover_and_list(missing, digest, kernels)
                finally:
                    self.cluster.release_discovery(digest)
                return
            left = self._take_lists(digests, kernels)
            if left is None:
                return
            if not left:
                return
            if state == "published":  # listed, yet not every task: discover them here
                self._discover_and_list(left, None, kernels)
                return
            missing = left
            self.cluster.wait(0.25)

    def _builder_waits(self, missing: list[Task], digests: dict[str, str], kernels) -> None:
        """A builder cannot discover: it takes lists as GPU nodes publish them, for at most
        BUILDER_WAIT_SECONDS (or the single-flight timeout, when shorter)."""
        assert self.cluster is not None
        deadline = time.monotonic() + min(BUILDER_WAIT_SECONDS, self.cluster.wait_limit)
        while missing and not self.stopped.is_set() and time.monotonic() < deadline:
            self.cluster.wait(0.5)
            left = self._take_lists(digests, kernels)
            if left is None:
                return
            missing = left
        if missing:
            self.kernel_list_source = f"no kernel list for {len(missing)} task(s)"

    def _discover_and_list(self, tasks: list[Task], digest: str | None, kernels) -> None:
        """Discover tasks here; each job, as soon as DeepGEMM named its entry, becomes a
        kernel to claim; the list is published at the end (digest None: not published)."""
        assert self.cluster is not None
        self.kernel_list_source = "discovered here"
        self._discover_tasks(tasks)
        while not self.stopped.is_set():
            last = self.discovery_done.is_set()
            kernels.add([n for n in self._map_jobs() if not (self.root / "cache" / n).exists()])
            if last:
                break
            time.sleep(POLL_SECONDS)
        self.cluster_moments["discovery_ended"] = time.monotonic()
        lists = {t.key: sorted(self.found_by_task.get(t.key, set())) for t in tasks}
        for key, entries in lists.items():
            if entries and all(n in self.listed for n in entries):
                self.task_lists[key] = tuple(entries)
        if digest is not None and not self.record_errors:
            digests = {t.key: task_digest(t) for t in tasks}
            jobs = {n: job.to_json() for n, job in self.listed.items()}
            published = self.cluster.publish_kernel_list(
                digest, {digests[k]: list(v) for k, v in self.task_lists.items()
                         if k in digests}, jobs)
            if published:
                self.cluster_moments["list_published"] = time.monotonic()

    def _map_jobs(self) -> list[str]:
        """The entries DeepGEMM named for the jobs recorded so far (a placeholder entry in
        the discovery's root holds the job's source): each listed; the new ones."""
        record = DeepGemmCacheAdapter(self.run / "record")
        include = str(self.install.location / "include") if self.install else ""
        try:
            with os.scandir(self.run / "jobs") as it:
                jobs = {hashlib.sha256(Job(Path(e.path)).source.read_bytes()).hexdigest():
                        Job(Path(e.path)) for e in it if e.is_dir() and Job(Path(e.path)).ready}
        except OSError:
            return []
        fresh = []
        for name in sorted(record.entry_names() - self.seeded - set(self.listed)):
            path = record.entries_dir / name
            if entry_state(path) != "complete":
                continue
            try:
                job = jobs.get(hashlib.sha256((path / "kernel.cu").read_bytes()).hexdigest())
            except OSError:
                continue
            if job is None:
                continue
            self.listed[name] = listed_from_entry(job, path, self.nvcc, include)
            fresh.append(name)
        return fresh

    def _cluster_lost(self, kernels) -> None:
        """A kernel list refused here: this node discovers and builds on its own."""
        log.warning("warmd: DeepGEMM kernel stage: %s; discovering here, sharing kernels "
                    "only as tasks finish", self.kernel_list_source)
        self.cluster = None
        self._discover_tasks(self.tasks)

    def _build_listed(self, entry: str) -> tuple[bool, float, str]:
        """Build one listed kernel into the cache root (the cluster publishes it)."""
        job = self.listed[entry]
        include = str(self.install.location / "include") if self.install else ""
        began = time.monotonic()
        failure = build_entry(self.run, job, self.nvcc, self.root, include, self._started)
        if failure is None:
            with self.lock:
                self.built_here.add(entry)
        return failure is None, time.monotonic() - began, failure or ""

    def task_entries(self, task_key: str) -> list[str] | None:
        """Once the cluster's work is done: the task's listed entries when every one is in
        the cache root (the task then needs no worker); None: run it through DeepGEMM."""
        if self.cluster is None and not self.cluster_report:
            return None
        self.cluster_done.wait()
        entries = self.task_lists.get(task_key)
        if entries is None:
            return None
        if not all(entry_state(self.root / "cache" / n) == "complete" for n in entries):
            return None
        return list(entries)

    @property
    def builder(self) -> bool:
        return self.cluster is not None and self.cluster.builder

    def _discovery_processes(self) -> int:
        """RECORDERS record (at most one per two compile jobs); without the fast path,
        one per compile job compiles."""
        if self.fast_path_off is None:
            return max(1, min(RECORDERS, self.jobs // 2))
        return self.jobs

    def _add_discovery(self, total: int) -> None:
        """Start discovery processes until total run, or each has a piece of work."""
        with self.lock:
            count = min(total - len(self.recorders), self.pending.qsize())
            started = []
            for _ in range(max(0, count)):
                env = dict(self.recorder_env)
                if self.gpu_ids:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids[len(self.recorders)
                                                               % len(self.gpu_ids)]
                worker = Worker(env, executors={"deep_gemm": RECORDER})
                self.recorders.append(worker)
                self.discovering += 1
                started.append(worker)
        for worker in started:
            self._thread(self._discover, worker, self.pending)

    def _fast_path_lost(self, reason: str) -> None:
        """Say once why the fast path is off; the discovery compiles from then on."""
        with self.lock:
            if self.fast_path_off is not None:
                return
            self.fast_path_off = reason
        log.warning("warmd: DeepGEMM kernel stage: fast path off: %s; compiling with up "
                    "to %d discovery processes instead", reason, self.jobs)

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _build_placeholder(self, arch: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            build_placeholder(self.run, self.nvcc, arch)

    def _discover(self, worker: Worker, pending: queue.Queue[Task]) -> None:
        while not self.stopped.is_set():
            try:
                task = pending.get_nowait()
            except queue.Empty:
                break
            result = worker.run(task)
            with self.lock:
                self.found_by_task.setdefault(self._task_of(task.key), set()).update(
                    k.name for k in result.kernels if k.outcome != "failed")
                for kernel in result.kernels:
                    if kernel.outcome == "compiled":
                        self.discovery_seconds.setdefault(kernel.name, kernel.seconds)
                if not result.ok:  # what it missed, the workers compile when they get there
                    self.record_errors.append(f"{task.key}: {result.error}")
        worker.stop()
        with self.lock:
            self.discovering -= 1
            if self.discovering == 0:
                self.discovered_at = time.monotonic()
                self.discovery_done.set()

    def _task_of(self, unit_key: str) -> str:
        """The task a discovery unit (a task, or an M range of one) belongs to."""
        return next((t.key for t in self.tasks if unit_key == t.key
                     or unit_key.startswith(f"{t.key}@m")), unit_key)

    def _watch(self) -> None:
        """Hand each recorded job to the compile pool as soon as it is written; link each
        real entry the discovery compiled itself into the cache root (and then know that
        the fast path is not running). With the cluster, its claims build the jobs."""
        while not self.stopped.is_set():
            last = self.discovery_done.is_set()
            if self.cluster is None:
                self._submit_new()
            self._link_real_entries()
            if self.fast_path_off is None:
                self._check_recording()
            if last:
                with self.lock:
                    self.all_submitted = True
                self._release_workers_if_due()
                return
            time.sleep(POLL_SECONDS)

    def _submit_new(self) -> None:
        try:
            with os.scandir(self.run / "jobs") as it:
                found = [Job(Path(e.path)) for e in it if e.is_dir()]
        except OSError:
            return
        for job in found:
            if job.key in self.futures or not job.ready:
                continue
            self.futures[job.key] = self.pool.submit(self._compile, job)

    def _link_real_entries(self) -> None:
        """Link every new complete entry of the throw-away root that holds a real kernel
        (not a placeholder, not seeded) into the cache root."""
        record = DeepGemmCacheAdapter(self.run / "record")
        fresh = record.entry_names() - self.seeded - self.linked - self.placeholder_entries
        if not fresh:
            return
        placeholders = {p.read_bytes() for p in self.run.glob("placeholder-*.cubin")}
        for name in sorted(fresh):
            path = record.entries_dir / name
            if entry_state(path) != "complete":
                continue  # looked at again next time
            try:
                if (path / "kernel.cubin").read_bytes() in placeholders:
                    self.placeholder_entries.add(name)
                    continue
                link_entry(path, self.root, self.run)
            except OSError:
                continue
            with self.lock:
                self.linked.add(name)

    def _check_recording(self) -> None:
        """The fast path is off once DeepGEMM compiled a kernel itself in the discovery:
        then every core compiles through discovery processes instead."""
        passed = read_passthrough(self.run)
        if passed:
            self._fast_path_lost("DeepGEMM called nvcc in a form the shim does not know "
                                 f"({' '.join(passed[0][:4])} ...)")
        elif self.linked:
            self._fast_path_lost("DeepGEMM compiled kernels without calling the shim "
                                 "(DG_JIT_NVCC_COMPILER not honoured)")
        else:
            return
        self._add_discovery(self._discovery_processes())

    def _compile(self, job: Job) -> str | None:
        self._release_workers_if_due()  # this job's future is running now
        if self.stopped.is_set():
            return "stopped"
        # A job a worker is compiling right now is theirs: this slot takes the next one.
        return compile_job(self.run, job, self.nvcc, self._started, wait=False)

    def _started(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.add(proc)
            stopping = self.stopped.is_set()
        if stopping:
            _terminate(proc)

    # -- during and after the run --

    def _release_workers_if_due(self) -> None:
        """Let the workers start once no job waits in the pool for its nvcc."""
        with self.lock:
            if not self.all_submitted:  # futures is final only from then on
                return
        if all(f.running() or f.done() for f in list(self.futures.values())):
            self.workers_may_start.set()

    def hold_workers(self, timeout: float = WORKERS_HELD_SECONDS) -> None:
        """Return once the library's workers should start: when discovery has ended and
        every kernel it named is compiling (or after timeout)."""
        self.workers_may_start.wait(timeout)

    def compile_seconds(self, entry: str) -> float | None:
        """nvcc's time for an entry of the real cache this run compiled (by its source), or
        the discovery call that compiled it without the fast path."""
        with self.lock:
            if entry in self.linked:
                return self.discovery_seconds.get(entry, 0.0)
        try:
            source = (self.root / "cache" / entry / "kernel.cu").read_bytes()
        except OSError:
            return None
        return self._compile_times().get(hashlib.sha256(source).hexdigest())

    def _compile_times(self) -> dict[str, float]:
        compiles = [c for c in read_compiles(self.run) if c.get("ok")]
        return {c["source_sha256"]: float(c["seconds"]) for c in compiles}

    def stop(self) -> None:
        self.stopped.set()
        self.discovery_done.set()
        self.cluster_done.set()
        self.workers_may_start.set()
        for worker in self.recorders:
            worker.stop(kill=True)
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            _terminate(proc)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def finish(self) -> dict:
        """Wait for the discovery and the compiles, remove the run's scratch, and say what
        happened."""
        for thread in self.threads:
            thread.join()
        self.pool.shutdown(wait=True, cancel_futures=self.stopped.is_set())
        for worker in self.recorders:
            worker.stop()
        compiles = read_compiles(self.run)
        try:
            jobs = [job for p in (self.run / "jobs").iterdir() if (job := Job(p)).ready]
        except OSError:
            jobs = []
        args = None
        with contextlib.suppress(OSError, ValueError):
            args = jobs[0].args() if jobs else None
        summary = {
            "library": "deep_gemm",
            "jobs": self.jobs,
            "deep_gemm": self.install.describe() if self.install else None,
            "fast_path": self.fast_path_off is None,
            "fast_path_off": self.fast_path_off,
            "discovery_processes": len(self.recorders),
            "compiled_in_discovery": len(self.linked),
            "seeded_entries": len(self.seeded),
            "discovered_kernels": len(self.futures),  # handed to the pool
            "kernel_jobs": len(jobs),  # distinct kernels asked for, by discovery or workers
            "discovery_seconds": round(self.discovered_at - self.began, 3)
            if self.discovered_at else None,
            "nvcc_runs": len(compiles),
            "nvcc_failed": sum(not c["ok"] for c in compiles),
            "distinct_sources": len({c["source_sha256"] for c in compiles}),
            "nvcc_seconds": round(sum(c["seconds"] for c in compiles), 3),
            "wall_seconds": round(time.monotonic() - self.began, 3),
            "discovery_errors": self.record_errors[:5],
            "nvcc": self.nvcc,
            "nvcc_args": args,  # DeepGEMM's arguments ({source}/{output}: the paths)
            "workers_started": sum(w.started for w in self.recorders),
            "timeline": stage_timeline(self.run, self.began_wall, jobs, compiles, self.jobs),
            "cluster": self.cluster_report,
        }
        shutil.rmtree(self.run, ignore_errors=True)
        return summary


def discovery_units(tasks: list[Task], count: int) -> list[Task]:
    """Fewer tasks than ``count`` discovery processes: each task cut into pieces of
    consecutive M values (at least two each), so that every process finds kernels at once.
    DeepGEMM picks a kernel config from M (with the shape), so pieces of distinct M ranges
    mostly find distinct kernels."""
    per_task = -(-count // max(1, len(tasks)))
    units = []
    for task in tasks:
        values = sorted(task.m)
        pieces = max(1, min(per_task, len(values) // 2))
        if pieces == 1:
            units.append(task)
            continue
        size = -(-len(values) // pieces)
        units += [replace(task, key=f"{task.key}@m{chunk[0]}-{chunk[-1]}", m=tuple(chunk))
                  for i in range(0, len(values), size) if (chunk := values[i:i + size])]
    return units


def local_arch_flag() -> str | None:
    """DeepGEMM's ``--gpu-architecture`` for this node's first GPU (sm_90a, sm_100a...)."""
    from warmd.targets import detect_local_gpus

    with contextlib.suppress(Exception):
        gpus = detect_local_gpus()
        if gpus and gpus[0].capability[0] >= 9:
            major, minor = gpus[0].capability
            return f"--gpu-architecture=sm_{major}{minor}a"
    return None


def stage_timeline(run: Path, began: float, jobs: list[Job], compiles: list[dict],
                   slots: int) -> dict:
    """Where the stage's time went, in seconds from its start: each discovery process's
    start-up (its module imported, torch ready, deep_gemm imported, first inputs made, its
    tasks done), when kernels became known, when nvcc ran, and how busy the slots were."""
    def at(moment: float | None) -> float | None:
        return None if moment is None else round(moment - began, 2)

    known = []
    for job in jobs:
        with contextlib.suppress(OSError):
            known.append(job.args_file.stat().st_mtime)
    recorders = []
    for path in sorted((run / "recorders").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            phases = data.get("phases") or {}
            recorders.append({**{name: at(phases.get(name)) for name in
                                 ("imported", "torch", "deep_gemm", "inputs")},
                              "done": at(max((t["ended"] for t in data["tasks"]),
                                             default=None))})
    starts = [c["began"] for c in compiles if "began" in c]
    ends = [c["began"] + c["seconds"] for c in compiles if "began" in c]
    span = (max(ends) - min(starts)) if starts else 0.0
    return {
        "discovery": sorted(recorders, key=lambda r: r["imported"] or 0.0),
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


def _terminate(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):
        proc.send_signal(signal.SIGTERM)
