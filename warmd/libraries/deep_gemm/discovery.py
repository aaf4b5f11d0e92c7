"""The discovery pass of DeepGEMM's kernel stage (compiler.py's step 1, and its fallback):
processes running the cold tasks' GEMMs with a throw-away cache root seeded with this node's
entries, each recorded job handed to the compile pool as it appears, each real entry the
discovery compiled itself linked into the cache root.
"""

from __future__ import annotations

import os
import queue
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path

from warmd.cache.durable import rename_noreplace
from warmd.executors.base import TaskResult
from warmd.executors.pool import Worker
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.nvcc_shim import Job, read_passthrough
from warmd.tasks import Task

RECORDER = "warmd.libraries.deep_gemm.executor:DeepGemmRecorder"
# Discovery processes on the node (at most one per two compile jobs). Few: processes that
# import torch at once slow each other down (on the H200 node one took 3.6 s alone, eight
# with four workers 6.3-7.3 s each), and one process names about 17 kernels a second once
# started, faster than any node compiles them.
RECORDERS = 2
POLL_SECONDS = 0.05


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


class DiscoveryPass:
    """The discovery's part of DeepGemmKernelStage (compiler.py), whose state it shares."""

    def _discover_tasks(self, tasks: list[Task]) -> None:
        """Start the discovery of these tasks, and the thread that follows it."""
        # Cut for the fallback's processes: the fast path's few take the pieces in turn.
        for unit in discovery_units(tasks, self.jobs):
            self.pending.put(unit)
        self._add_discovery(self._discovery_processes())
        self._thread(self._watch)

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
            worker = Worker(env, executors={"deep_gemm": self.recorder})
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
