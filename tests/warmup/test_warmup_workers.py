"""How a node's warmup sizes and runs its workers: the default worker count, one worker per
cold task, warm-only runs that start none, and a worker stopped while held back."""

from __future__ import annotations

import threading

from warmd.tasks import Task
from warmd.warmup import default_workers

GIB = 1 << 30


def test_default_workers_one_per_core_bounded_by_memory_at_least_one_per_gpu():
    assert default_workers(1, cpus=16, memory_bytes=128 * GIB) == 16  # the H200 node
    assert default_workers(0, cpus=2, memory_bytes=23 * GIB) == 2  # this machine
    assert default_workers(0, cpus=16, memory_bytes=8 * GIB) == 4  # 2 GiB per compile
    assert default_workers(8, cpus=4, memory_bytes=512 * GIB) == 8
    assert default_workers(0, cpus=1, memory_bytes=1 * GIB) == 1


def test_warm_only_runs_nothing_when_a_task_needs_its_library(tmp_path, monkeypatch):
    """The agent's check: a plan with a task not in any cache starts no worker and
    compiles nothing; it says which tasks are left for the GPU workers."""
    from flashinfer_support import flashinfer_plan

    from warmd.warmup import WarmupOptions, run_warmup

    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    plan = flashinfer_plan()
    options = WarmupOptions(libraries=("flashinfer",), task_filter="silu_and_mul",
                            cache_roots={"flashinfer": tmp_path / "fi"}, warm_only=True)
    report = run_warmup(plan, options)
    assert len(report.not_warm) == 1 and "silu_and_mul" in report.not_warm[0]
    assert report.reports == [] and report.workers == 0
    assert not (tmp_path / "fi").exists() and not (tmp_path / "state" / "logs").exists()


def test_workers_follow_the_cold_tasks_not_the_selected_ones():
    """One cold module beside warm ones gets one worker and every core for its ninja (it
    was given jobs // tasks: one core of two on the CPU machine, measured in
    docs/benchmarks.md); workers stay within the jobs and four per GPU."""
    from warmd.warmup import worker_count

    assert worker_count(jobs=2, cold=1, gpus=0) == 1
    assert worker_count(jobs=16, cold=4, gpus=1) == 4
    assert worker_count(jobs=16, cold=12, gpus=1) == 4
    assert worker_count(jobs=16, cold=12, gpus=8) == 12
    assert worker_count(jobs=2, cold=7, gpus=0) == 2
    assert worker_count(jobs=4, cold=0, gpus=0) == 1


def test_a_worker_stopped_while_held_starts_no_process():
    """A worker waiting for its environment (a kernel stage holding workers back) and
    stopped meanwhile (Ctrl-C) fails its task as interrupted and starts no process."""
    from warmd.executors.pool import Worker

    entered, release = threading.Event(), threading.Event()

    def held_env() -> dict[str, str]:
        entered.set()
        release.wait(30)
        return {}

    worker = Worker(held_env)
    task = Task(key="deep_gemm/fp8_gemm_nt/128x256/t", library="deep_gemm",
                kernel="fp8_gemm_nt", n=256, k=128, m=(1,))
    results = []
    thread = threading.Thread(target=lambda: results.append(worker.run(task)))
    thread.start()
    assert entered.wait(30)  # the worker is held, its process not started
    worker.stop(kill=True)
    release.set()
    thread.join(30)
    assert results and not results[0].ok and "interrupted" in results[0].error
    assert not worker.started
