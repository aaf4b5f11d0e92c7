"""A FAKE of what this machine cannot have: DeepGEMM running GEMMs on a GPU. It stands in
for the discovery processes of DeepGEMM's kernel stage only, so that the stage's cluster
work (slices claimed, listed, taken over; kernels claimed and built with the real nvcc)
runs here for real; it says nothing about DeepGEMM or any GPU.

``FakeGpuDeepGemmRecorder`` plays DeepGEMM 0.1.x's JIT in a discovery process: per GEMM
call (each M of a task) it picks a kernel config from M, and the first time this process
needs a kernel it writes the kernel's source, calls ``DG_JIT_NVCC_COMPILER`` (the stage's
recording shim) exactly as DeepGEMM calls nvcc, and renames the entry into
``DG_JIT_CACHE_DIR``'s cache/; a kernel this process loaded before is reused silently,
as DeepGEMM's runtime cache does. Every task also needs one shared helper kernel (as
DeepGEMM's transpose), so tasks share kernels. ``FAKE_GPU_DG_SECONDS_PER_CALL`` slows
each call down (a slow discovery, for tests that kill a node during one).

Run as a script (argv[1]: JSON), it is one cluster node: ``run_warmup`` of a plan of
DeepGEMM tasks against a real store, with this fake as the stage's recorder; it prints
the warmup's report as one JSON line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter, entry_state
from warmd.tasks import Task

TARGET = f"{__name__}:FakeGpuDeepGemmRecorder"
KERNEL = ("template <int N, int K, int B> __global__ void fake_gemm(float* x) "
          "{{ x[threadIdx.x] *= N + K + B; }}\n"
          "static void* p = (void*)&fake_gemm<{n}, {k}, {block}>;\n")
HELPER = "__global__ void fake_transpose(float* x) { x[threadIdx.x] += 1.0f; }\n"
FLAGS = ["-std=c++17", "--gpu-architecture=sm_90a", "-O3"]


def block_of(m: int) -> int:
    """The fake's kernel config for one M (DeepGEMM picks block sizes from M)."""
    return 64 if m <= 64 else 128 if m <= 512 else 256


def kernel_source(task: Task, m: int) -> str:
    return KERNEL.format(n=task.n, k=task.k, block=block_of(m))


def entry_name(source: str) -> str:
    return f"kernel.fake_gemm.{hashlib.sha256(source.encode()).hexdigest()[:32]}"


def kernels_of(task: Task) -> set[str]:
    """Every entry a task's calls need."""
    return {entry_name(kernel_source(task, m)) for m in task.m} | {entry_name(HELPER)}


class FakeGpuDeepGemmRecorder(Executor):
    library = "deep_gemm"

    def __init__(self) -> None:
        self.root = Path(os.environ["DG_JIT_CACHE_DIR"])
        self.loaded: set[str] = set()
        self.pause = float(os.environ.get("FAKE_GPU_DG_SECONDS_PER_CALL", "0"))

    def cache(self) -> DeepGemmCacheAdapter:
        return DeepGemmCacheAdapter(self.root)

    def check(self) -> tuple[bool, str]:
        return True, ""

    def run(self, task: Task) -> TaskResult:
        began = time.monotonic()
        kernels = []
        try:
            for m in task.m:
                time.sleep(self.pause)
                for source in (HELPER, kernel_source(task, m)):
                    outcome = self._load(source)
                    if outcome is not None:
                        kernels.append(outcome)
        except (OSError, subprocess.SubprocessError) as exc:
            return TaskResult(task.key, self.library, False, time.monotonic() - began,
                              kernels, f"fake DeepGEMM: {exc}")
        return TaskResult(task.key, self.library, True, time.monotonic() - began, kernels)

    def _load(self, source: str) -> KernelOutcome | None:
        name = entry_name(source)
        if name in self.loaded:
            return None  # in this process's runtime cache: not reported again
        self.loaded.add(name)
        entry = self.root / "cache" / name
        if entry_state(entry) == "complete":
            return KernelOutcome(name, "local_hit")
        began = time.monotonic()
        build = self.root / "tmp" / uuid.uuid4().hex
        build.mkdir(parents=True)
        (build / "kernel.cu").write_text(source)
        compiler = os.environ["DG_JIT_NVCC_COMPILER"]
        subprocess.run([compiler, str(build / "kernel.cu"), "-cubin", "-o",
                        str(build / "kernel.cubin"), *FLAGS], check=True,
                       capture_output=True, timeout=120)
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(build, entry)
        except OSError:  # another process of the node wrote it meanwhile
            return KernelOutcome(name, "local_hit")
        return KernelOutcome(name, "compiled", time.monotonic() - began)


def fake_tasks(shapes: list[tuple[int, int]], m: list[int]) -> tuple[Task, ...]:
    """DeepGEMM dense GEMM tasks, one per (N, K), each over these M values."""
    return tuple(Task("deep_gemm", "fp8_gemm_nt", n=n, k=k, m=tuple(m),
                      key=f"deep_gemm/fp8_gemm_nt/{n}x{k}/fake") for n, k in shapes)


def main() -> None:
    from store_support import _any_plan

    from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage
    from warmd.store import open_shared_cache
    from warmd.warmup import WarmupOptions, run_warmup

    args = json.loads(sys.argv[1])
    DeepGemmKernelStage.recorder = TARGET
    shared = open_shared_cache(args["url"], node=args["node"], kernel_lease_seconds=3.0)
    tasks = fake_tasks([tuple(s) for s in args["shapes"]], args["m"])
    plan = dataclasses.replace(_any_plan(), tasks=tasks)
    options = WarmupOptions(libraries=("deep_gemm",), gpu_ids=(), workers=1,
                            cache_roots={"deep_gemm": Path(args["root"])})
    report = run_warmup(plan, options, shared=shared)
    shared.close()
    [stage] = report.stages
    print(json.dumps({"failed": [r.result.error for r in report.failed],
                      "stage": stage.to_json(),
                      "workers": report.workers, "kernels": report.counters.kernel_counts()},
                     default=str))


if __name__ == "__main__":
    main()
