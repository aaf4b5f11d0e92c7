"""DeepGEMM's kernel stage: each distinct kernel a plan needs, compiled once on the node,
on every core, before and while the workers run the tasks.

A task is one GEMM shape and its M values; DeepGEMM's heuristics pick a kernel config per
call, and many calls (M values of one block configuration) share one kernel.
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
import shutil
import subprocess
import time
from pathlib import Path

from warmd import settings
from warmd.executors.base import StageCluster, StageReport
from warmd.executors.stage import stage_timeline
from warmd.executors.stage_cluster import ClusterStage
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.libraries.deep_gemm.discovery import RECORDER, DeepGemmDiscovery, seed_entries
from warmd.libraries.deep_gemm.install import (
    KNOWN_VERSIONS,
    DeepGemmInstall,
    Generation,
    nvrtc_on,
    resolve,
)
from warmd.libraries.deep_gemm.kernel_lists import DeepGemmLists
from warmd.libraries.deep_gemm.nvcc_shim import (
    BUILD,
    RECORD,
    Job,
    build_placeholder,
    compile_job,
    make_slots,
    read_compiles,
    set_compile_nice,
    write_shim,
)
from warmd.tasks import Task

log = logging.getLogger(__name__)


def real_nvcc() -> str:
    """The compiler DeepGEMM would run: DG_JIT_NVCC_COMPILER, else CUDA_HOME's nvcc."""
    chosen = settings.deep_gemm_nvcc()
    return str(chosen) if chosen else str(settings.cuda_home() / "bin" / "nvcc")


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


class DeepGemmKernelStage(DeepGemmLists, DeepGemmDiscovery, ClusterStage):
    """See the module docstring; a warmd.executors.base.KernelStage. The machinery (its
    discovery processes, compile slots, worker gating, the cluster's slices and kernels)
    is warmd.executors.stage's; what is DeepGEMM's is here: the shim and its job format
    (nvcc_shim.py, listed.py), following the discovery (discovery.py), the kernel lists'
    hooks (kernel_lists.py) and the report."""

    library = "deep_gemm"
    recorder = RECORDER  # the discovery processes' executor ("module:Class")

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str], cluster: StageCluster | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(root, tasks, jobs, gpu_ids, env, cluster, timeout)
        self.nvcc = real_nvcc()
        self.nice = settings.compile_nice()
        self.install = resolve()  # the DeepGEMM the workers import
        self.seeded: set[str] = set()
        self.placeholder_entries: set[str] = set()  # recorded, never published
        self.linked: set[str] = set()  # real entries of the discovery, linked into root
        self.built_here: set[str] = set()  # listed kernels this node built (claimed)
        self.jobs_by_source: dict[str, Job] = {}  # recorded jobs by their source's digest
        self.hashed_jobs: set[str] = set()  # the job directories read into it

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
        arch = local_arch()
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

    def _fast_path_lost(self, reason: str) -> None:
        """Say once why the fast path is off; the discovery compiles from then on."""
        with self.lock:
            if self.fast_path_off is not None:
                return
            self.fast_path_off = reason
        log.warning("warmd: DeepGEMM kernel stage: fast path off: %s; compiling with up "
                    "to %d discovery processes instead", reason, self.jobs)

    def _build_placeholder(self, arch: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            build_placeholder(self.run, self.nvcc, arch)

    def _compile(self, job: Job) -> str | None:
        self._release_workers_if_due()  # this job's future is running now
        if self.stopped.is_set():
            return "stopped"
        # A job a worker is compiling right now is theirs: this slot takes the next one.
        return compile_job(self.run, job, self.nvcc, self._started, wait=False,
                           timeout=self.timeout)

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

    def finish(self) -> StageReport:
        """Wait for the discovery and the compiles, remove the run's scratch, and say what
        happened."""
        self._join()
        compiles = read_compiles(self.run)
        try:
            jobs = [job for p in (self.run / "jobs").iterdir() if (job := Job(p)).ready]
        except OSError:
            jobs = []
        args = None
        with contextlib.suppress(OSError, ValueError):
            args = jobs[0].args() if jobs else None
        detail = {
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
            "timeline": stage_timeline(self.began_wall, _known(jobs), _recorders(self.run),
                                       compiles, self.jobs),
        }
        shutil.rmtree(self.run, ignore_errors=True)
        return StageReport(self.library, sum(w.started for w in self.recorders),
                           self.cluster_report, detail)


def local_arch() -> str | None:
    """The arch DeepGEMM compiles for on this node's first GPU (sm_90a, sm_100a...)."""
    from warmd.targets import detect_local_gpus

    with contextlib.suppress(Exception):
        gpus = detect_local_gpus()
        if gpus:
            return deep_gemm_arch(gpus[0].capability)
    return None


def deep_gemm_arch(capability: tuple[int, int]) -> str | None:
    """What DeepGEMM passes as ``--gpu-architecture`` for a GPU of this capability (the
    arch-specific ``a`` target, Hopper on); None below Hopper."""
    major, minor = capability
    return f"sm_{major}{minor}a" if major >= 9 else None


def _known(jobs: list[Job]) -> list[float]:
    """When each job was recorded (its arguments written)."""
    known = []
    for job in jobs:
        with contextlib.suppress(OSError):
            known.append(job.args_file.stat().st_mtime)
    return known


def _recorders(run: Path) -> list[dict]:
    """Each discovery process's start-up moments (module imported, torch ready, deep_gemm
    imported, first inputs made) and when its pieces were done, as DeepGemmRecorder wrote
    them."""
    found = []
    for path in sorted((run / "recorders").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            phases = data.get("phases") or {}
            found.append({**{name: phases.get(name) for name in
                             ("imported", "torch", "deep_gemm", "inputs")},
                          "done": max((t["ended"] for t in data["tasks"]), default=None)})
    return found
