"""Stopping a run's workers: all are asked to exit before any is waited for, so that workers
slow to exit (a CUDA context's teardown) exit side by side, not one after the other; each
one's process is gone afterwards. Real spawned processes."""

from __future__ import annotations

import json

from warmd.executors.pool import Worker, stop_workers
from warmd.processes import pid_alive
from warmd.tasks import Task

TARGET = "slow_exit_executor:SlowExitExecutor"


def _started_workers(tmp_path, count: int) -> list[Worker]:
    env = {"WARMD_STATE_DIR": str(tmp_path / "state"), "WARMD_TEST_EXIT_DIR": str(tmp_path)}
    workers = [Worker(env, executors={"deep_gemm": TARGET}) for _ in range(count)]
    for i, worker in enumerate(workers):
        result = worker.run(Task("deep_gemm", "k", key=f"deep_gemm/t{i}"))
        assert result.ok, result.error
    return workers


def test_workers_stopped_together_exit_side_by_side(tmp_path):
    workers = _started_workers(tmp_path, 3)
    pids = [w.pid for w in workers]
    stop_workers(workers)
    exits = [json.loads((tmp_path / f"{pid}.json").read_text()) for pid in pids]
    # every worker began exiting before the first one had finished
    assert max(began for began, _ in exits) < min(ended for _, ended in exits)
    assert not any(pid_alive(pid) for pid in pids)
    assert all(w.stopped for w in workers)


def test_killed_workers_are_gone_without_their_exit(tmp_path):
    workers = _started_workers(tmp_path, 2)
    pids = [w.pid for w in workers]
    stop_workers(workers, kill=True)
    assert not any(pid_alive(pid) for pid in pids)
    assert not any((tmp_path / f"{pid}.json").exists() for pid in pids)
