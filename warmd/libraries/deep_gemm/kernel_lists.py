"""The cluster's share of DeepGEMM's kernel stage, with a shared cache: the kernel lists of
tasks read from the cluster, the tasks nobody listed discovered once in the cluster
(claimed) and listed, and each listed kernel this node lacks built by claiming it
cluster-wide (or installed when another node did). A builder only follows lists.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

from warmd.coordination import ClaimState
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.discovery import POLL_SECONDS
from warmd.libraries.deep_gemm.listed import (
    BadListing,
    ListedJob,
    build_entry,
    listed_from_entry,
    set_digest,
    task_digest,
)
from warmd.libraries.deep_gemm.nvcc_shim import Job
from warmd.tasks import Task

# A builder waits this long at most for GPU nodes to publish the kernel lists of its tasks.
BUILDER_WAIT_SECONDS = 120.0

log = logging.getLogger(__name__)


class ClusterKernelLists:
    """The cluster's part of DeepGemmKernelStage (compiler.py), whose state it shares."""

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
            if state is ClaimState.MINE:
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
            if state is ClaimState.PUBLISHED:  # listed, yet not every task: discover them here
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
