"""DeepGEMM's part of the cluster's kernel lists (warmd.executors.stage_cluster): its job
format (``listed.ListedJob``: a kernel as the discovery recorded it), the entries its
discovery named (a placeholder entry in the throw-away root holds the job's source), how a
listed kernel is built (``listed.build_entry``), and when an entry is complete.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.costs import TYPICAL_SECONDS, expected_seconds
from warmd.libraries.deep_gemm.listed import (
    ListedJob,
    build_entry,
    listed_from_entry,
    task_digest,
)
from warmd.libraries.deep_gemm.nvcc_shim import Job
from warmd.tasks import Task


class DeepGemmLists:
    """DeepGemmKernelStage's hooks of ClusterStage (compiler.py), whose state it shares."""

    def _parse_listed(self, data: dict) -> ListedJob:
        return ListedJob.from_json(data)  # BadListing is a ValueError

    def _task_digest(self, task: Task) -> str:
        return task_digest(task)

    def _entry_complete(self, name: str) -> bool:
        return entry_state(self.root / "cache" / name) == "complete"

    def _expected_seconds(self, entry: str) -> float:
        with self.list_lock:
            job = self.listed.get(entry)
        return expected_seconds(job.source) if job is not None else TYPICAL_SECONDS

    def _map_jobs(self) -> list[str]:
        """The entries DeepGEMM named for the jobs recorded so far (a placeholder entry in
        the discovery's root holds the job's source): each listed; the new ones."""
        with self.list_lock:
            return self._map_new_jobs()

    def _map_new_jobs(self) -> list[str]:
        record = DeepGemmCacheAdapter(self.run / "record")
        names = sorted(record.entry_names() - self.seeded - set(self.listed))
        if not names:
            return []
        include = str(self.install.location / "include") if self.install else ""
        jobs = self._jobs_by_source()
        fresh = []
        for name in names:
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

    def _jobs_by_source(self) -> dict[str, Job]:
        """Each recorded job by its source's digest; each job read and hashed once (this
        runs every poll of the discovery)."""
        try:
            with os.scandir(self.run / "jobs") as it:
                found = [Job(Path(e.path)) for e in it
                         if e.is_dir() and e.name not in self.hashed_jobs]
        except OSError:
            return self.jobs_by_source
        for job in found:
            if not job.ready:
                continue  # being written: read at a later poll
            try:
                digest = hashlib.sha256(job.source.read_bytes()).hexdigest()
            except OSError:
                continue
            self.jobs_by_source[digest] = job
            self.hashed_jobs.add(job.path.name)
        return self.jobs_by_source

    def _build_listed(self, entry: str) -> tuple[bool, float, str]:
        """Build one listed kernel into the cache root (the cluster publishes it)."""
        job = self.listed[entry]
        include = str(self.install.location / "include") if self.install else ""
        began = time.monotonic()
        failure = build_entry(self.run, job, self.nvcc, self.root, include, self._started,
                              self.timeout)
        if failure is None:
            with self.lock:
                self.built_here.add(entry)
        return failure is None, time.monotonic() - began, failure or ""
