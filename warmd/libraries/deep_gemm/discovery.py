"""DeepGEMM's part of its kernel stage's discovery (the processes and their pieces of work:
warmd.executors.stage): a throw-away cache root seeded with this node's entries, each
recorded job handed to the compile pool as it appears, each real entry the discovery
compiled itself linked into the cache root (and then the fast path known to be off).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from warmd.cache.durable import rename_noreplace
from warmd.executors.stage_cluster import POLL_SECONDS
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.nvcc_shim import Job, read_passthrough

RECORDER = "warmd.libraries.deep_gemm.executor:DeepGemmRecorder"


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


class DeepGemmDiscovery:
    """DeepGemmKernelStage's following of its discovery (compiler.py), whose state it
    shares."""

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
