"""A compile worker's output goes to <state dir>/logs/worker-<pid>.log; a worker that said
nothing leaves no file behind (one empty log per worker ever started piled up)."""

from __future__ import annotations

from pathlib import Path

from store_support import registered_testlib
from testlib import NAME, ROOT_ENV

from warmd.executors.pool import Worker
from warmd.plan import Task


def _run_one(tmp_path: Path, spec: dict) -> list[Path]:
    state = tmp_path / "state"
    worker = Worker({"WARMD_STATE_DIR": str(state), ROOT_ENV: str(tmp_path / "cache")})
    task = Task(key=f"{NAME}/t", library=NAME, kernel="write_entries", spec=spec)
    try:
        result = worker.run(task)
    finally:
        worker.stop()
    assert result.ok, result.error
    return sorted((state / "logs").glob("worker-*.log"))


def test_a_quiet_worker_leaves_no_log(tmp_path):
    with registered_testlib():
        assert _run_one(tmp_path, {"entries": ["a"]}) == []


def test_a_worker_that_printed_keeps_its_log(tmp_path):
    with registered_testlib():
        [log] = _run_one(tmp_path, {"entries": ["a"], "say": "nvcc: warning: chatter"})
    assert log.read_text() == "nvcc: warning: chatter\n"
