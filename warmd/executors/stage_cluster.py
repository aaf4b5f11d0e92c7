"""A kernel stage's share of the cluster's work, with a shared cache (for any library whose
kernels a discovery names, warmd.executors.stage). The plan's tasks are cut into discovery
slices (``discovery_slices``: the same on every node), and each slice is a unit of cluster
work: read from the store when any node of this library build and GPU listed it before (in
any namespace), else claimed and discovered by one node's discovery processes, its kernel
list published the moment it is done. Every kernel a list names is claimed cluster-wide
and built (or installed when another node built it) as soon as it is known, so nodes
compile while others still discover. A builder has no GPU: it only follows lists.

The library says how a listed kernel is read (``_parse_listed``), which kernels its
discovery named so far (``_map_jobs``), how one is built (``_build_listed``), how long that
is expected to take (``_expected_seconds``: the longest are claimed first) and whether an
entry is complete (``_entry_complete``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from warmd.coordination import DiscoveryReport
from warmd.executors.base import StageCluster, StageClusterReport
from warmd.executors.pool import Worker, stop_workers
from warmd.executors.stage import CompileStage, m_pieces
from warmd.tasks import Task

# A builder waits this long at most for GPU nodes to publish the kernel lists of its tasks.
BUILDER_WAIT_SECONDS = 120.0
# M values per discovery slice. A discovery process runs a few hundred GEMM calls a second
# once started, so a slice is well under a second of its time: small enough that K nodes'
# processes share a plan's few thousand M values evenly to the end, large enough that the
# claim and the list (two store round trips) are a small part of it.
SLICE_M = 128
POLL_SECONDS = 0.05

log = logging.getLogger(__name__)


class Listed(Protocol):
    """How one listed kernel is built (the library's job format)."""

    entry: str

    def to_json(self) -> dict: ...


def discovery_slices(tasks: list[Task]) -> list[Task]:
    """The tasks cut into slices of at most SLICE_M consecutive M values (a task of no more
    is its own slice), taken round robin across the tasks, so that the first slices any
    node discovers name kernels of every GEMM. A function of the tasks alone: every node
    of the cluster cuts the same slices, whatever its cores."""
    pieces = [m_pieces(task, SLICE_M) for task in sorted(tasks, key=lambda t: t.key)]
    longest = max((len(p) for p in pieces), default=0)
    return [p[i] for i in range(longest) for p in pieces if i < len(p)]


class ClusterStage(CompileStage):
    """See the module docstring: the cluster's part of a CompileStage."""

    def _parse_listed(self, data: dict) -> Listed:
        """A listed kernel's job record, checked (raises ValueError)."""
        raise NotImplementedError

    def _map_jobs(self) -> list[str]:
        """The entries the discovery named since the last call, each now in ``listed``."""
        raise NotImplementedError

    def _build_listed(self, entry: str) -> tuple[bool, float, str]:
        """Build one listed kernel into the cache root: (ok, seconds, why not)."""
        raise NotImplementedError

    def _entry_complete(self, name: str) -> bool:
        raise NotImplementedError

    def _expected_seconds(self, entry: str) -> float:
        """How long building a listed kernel is expected to take (only the order counts:
        the longest are claimed first; all equal: in the order they became known)."""
        return 0.0

    def _task_digest(self, task: Task) -> str:
        """What a slice's kernel list is published under."""
        raise NotImplementedError

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str], cluster: StageCluster | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(root, tasks, jobs, gpu_ids, env, cluster, timeout)
        self.listed: dict[str, Any] = {}  # entry -> how it is built (the kernel list)
        self.slice_lists: dict[str, tuple[str, ...]] = {}  # slice digest -> entries, listed
        self.list_lock = threading.Lock()  # listed and slice_lists, from several threads
        self.cluster_report: StageClusterReport | None = None
        self.discovery_report: DiscoveryReport | None = None  # the slices: who did what
        self.kernel_list_source = ""  # "read", "discovered here", or why none
        self.named_in: dict[Worker, set[str]] = {}  # what each discovery process named
        self.jobs_sent: set[str] = set()  # each job goes to the store once
        self.slice_tasks: dict[str, Task] = {}  # slice digest -> the slice
        self.slices_of: dict[str, list[str]] = {}  # task key -> its slices' digests

    def _cluster_work(self) -> None:
        """Take the lists the store holds of the plan's slices; discover the others slice
        by slice across the cluster (a builder waits for GPU nodes to list them); build
        each listed kernel this node lacks by claiming it cluster-wide (or install it when
        another node did)."""
        cluster = self.cluster
        assert cluster is not None
        began = time.monotonic()
        self.cluster_moments: dict[str, float] = {}
        self._cut_slices()
        self.kernels = kernels = cluster.run_kernels(self._build_listed, self.jobs,
                                                     self._expected_seconds)
        try:
            missing = self._take_lists(list(self.slice_tasks))
            if missing is None:
                self._cluster_lost()
                return
            self.cluster_moments["lists_read"] = time.monotonic()
            if missing and not cluster.builder:
                self._discover_slices(missing)
            elif missing:
                self._builder_waits(missing)
            if not self.kernel_list_source:
                self.kernel_list_source = "read"
        finally:
            kernels.close()
            boot = kernels.join()
            boot.timeline = {**boot.timeline, **{k: round(v - began, 3)
                                                 for k, v in self.cluster_moments.items()}}
            self.cluster_report = StageClusterReport(self.library, boot,
                                                     self.kernel_list_source,
                                                     self.discovery_report)
            self.cluster_done.set()
            self.discovery_done.set()
            self.workers_may_start.set()

    def _cut_slices(self) -> None:
        slices = discovery_slices(self.tasks)
        self.slice_tasks = {self._task_digest(s): s for s in slices}
        for digest, piece in self.slice_tasks.items():
            self.slices_of.setdefault(self._task_of(piece.key), []).append(digest)

    def _take_lists(self, digests: list[str]) -> list[str] | None:
        """Take what the cluster listed of these slices; the slices still unlisted (None:
        a list was refused here: none is used)."""
        assert self.cluster is not None
        wanted = [d for d in digests if d not in self.slice_lists]
        listing = self.cluster.kernel_list(wanted) if wanted else None
        if listing is not None and listing.refused:
            self.kernel_list_source = f"refused: {listing.refused}"
            return None
        fresh = []
        for digest, entries in (listing.tasks.items() if listing else ()):
            try:
                jobs = [self._parse_listed(listing.jobs[n])
                        for n in (*entries, *listing.also.get(digest, ()))]
            except ValueError as exc:
                self.kernel_list_source = f"refused: {exc}"
                return None
            with self.list_lock:
                self.slice_lists[digest] = tuple(entries)
                for job in jobs:
                    if job.entry not in self.listed:
                        self.listed[job.entry] = job
                        fresh.append(job.entry)
        self._add_kernels(fresh)
        return [d for d in digests if d not in self.slice_lists]

    def _add_kernels(self, names: list[str]) -> None:
        self.kernels.add([n for n in names if not (self.root / "cache" / n).exists()])

    def _discover_slices(self, missing: list[str]) -> None:
        """Discover the unlisted slices with the cluster: each claimed, discovered here
        on one of this node's discovery processes and listed, or taken from the list
        another node publishes meanwhile; each kernel becomes a claim the moment the
        library names it here."""
        assert self.cluster is not None
        recorders = [self._new_recorder() for _ in range(self._discovery_processes())]
        self._thread(self._watch)
        self.cluster_moments["discovery_began"] = time.monotonic()
        run = self.discovery_run = self.cluster.run_discovery(
            missing, self._discover_slice, self._take_slices, recorders)
        while not run.done() and not self.stopped.is_set():
            self._add_kernels(self._map_jobs())
            time.sleep(POLL_SECONDS)
        self.discovery_report = run.join()
        self._add_kernels(self._map_jobs())
        stop_workers(recorders)
        self.cluster_moments["discovery_ended"] = self.discovered_at = time.monotonic()
        self.discovery_done.set()
        here = self.discovery_report.discovered_here
        if here:
            self.kernel_list_source = (f"discovered here: {here} of "
                                       f"{self.discovery_report.slices} slice(s)")

    def _discover_slice(self, digest: str, recorder: Worker) -> tuple[bool, float, str]:
        """Discover one slice this node holds, and publish its list."""
        began = time.monotonic()
        result = self._record(recorder, self.slice_tasks[digest])
        self._add_kernels(self._map_jobs())
        seconds = time.monotonic() - began
        if not result.ok:
            return False, seconds, result.error or "discovery failed"
        with self.list_lock:
            named = self.named_in.setdefault(recorder, set())
            entries = sorted({k.name for k in result.kernels if k.outcome != "failed"})
            before = sorted(named - set(entries))
            named.update(entries)
        self._publish_slice(digest, entries, before)
        return True, seconds, ""

    def _publish_slice(self, digest: str, entries: list[str], also: list[str]) -> None:
        """List a slice: the kernels its calls named (its own: what its task is counted
        as needing, as without slices), and ``also`` the ones its discovery process had
        named before it. A library names a kernel once per process (the first call that
        loads it: DeepGEMM does), so a slice reusing an earlier one's kernel does not name
        it; a node of another plan that reads this slice builds both, so it never lacks
        one. A process that named an entry this node had before the run (no job recorded)
        lists nothing more: another node lists those slices."""
        with self.list_lock:
            if not all(n in self.listed for n in (*entries, *also)):
                return
            jobs = {n: self.listed[n].to_json() for n in (*entries, *also)
                    if n not in self.jobs_sent}
            self.slice_lists[digest] = tuple(entries)
        assert self.cluster is not None
        if self.cluster.publish_kernel_list(digest, {digest: entries}, jobs,
                                            {digest: also}):
            with self.list_lock:
                self.jobs_sent.update(jobs)

    def _take_slices(self, digests: list[str]) -> set[str]:
        """The slices among these that other nodes listed, taken (their kernels claimed)."""
        left = self._take_lists(digests)
        return set(digests) - set(digests if left is None else left)

    def _builder_waits(self, missing: list[str]) -> None:
        """A builder cannot discover: it takes lists as GPU nodes publish them, for at most
        BUILDER_WAIT_SECONDS (or the single-flight timeout, when shorter)."""
        assert self.cluster is not None
        deadline = time.monotonic() + min(BUILDER_WAIT_SECONDS, self.cluster.wait_limit)
        while missing and not self.stopped.is_set() and time.monotonic() < deadline:
            self.cluster.wait(0.5)
            left = self._take_lists(missing)
            if left is None:
                return
            missing = left
        if missing:
            tasks = {self._task_of(self.slice_tasks[d].key) for d in missing}
            self.kernel_list_source = f"no kernel list for {len(tasks)} task(s)"

    def _cluster_lost(self) -> None:
        """A kernel list refused here: this node discovers and builds on its own."""
        log.warning("warmd: %s kernel stage: %s; discovering here, sharing kernels only as "
                    "tasks finish", self.library, self.kernel_list_source)
        self.cluster = None
        self._discover_tasks(self.tasks)

    def task_entries(self, task_key: str) -> list[str] | None:
        """Once the cluster's work is done: the task's listed entries (of all its slices)
        when every one is in the cache root (the task then needs no worker); None: run it
        through the library."""
        if self.cluster is None and not self.cluster_report:
            return None
        self.cluster_done.wait()
        digests = self.slices_of.get(task_key)
        if not digests or not all(d in self.slice_lists for d in digests):
            return None
        entries = sorted({n for d in digests for n in self.slice_lists[d]})
        if not all(self._entry_complete(n) for n in entries):
            return None
        return entries

    @property
    def builder(self) -> bool:
        return self.cluster is not None and self.cluster.builder
