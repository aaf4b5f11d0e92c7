"""Worker logs (<state dir>/logs/worker-<pid>.log): one per worker process, rotated, and
none left behind by a worker that wrote nothing (one empty log per worker ever started
piled up). Real spawned processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from store_support import registered_testlib
from testlib import NAME, ROOT_ENV

from warmd.executors.pool import MAX_WORKER_LOGS, Worker, _rotate_worker_logs
from warmd.tasks import Task

SRC = str(Path(__file__).resolve().parents[2])
# A worker process as the pool sets it up (its output redirected to its log), given a
# smaller keep count so that a few processes show the rotation.
_WORKER = """
import sys
import warmd.executors.pool as pool
pool.MAX_WORKER_LOGS = int(sys.argv[1])
log = pool._log_output_to_file()
if sys.argv[2]:
    print(sys.argv[2])
pool._drop_if_empty(log)
"""


def _worker(state: Path, keep: int, says: str) -> None:
    env = {**os.environ, "WARMD_STATE_DIR": str(state), "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", _WORKER, str(keep), says], env=env, check=True,
                   timeout=60)


def _logs(state: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in (state / "logs").glob("worker-*.log")}


def test_a_worker_that_writes_nothing_leaves_no_log(tmp_path):
    for _ in range(3):
        _worker(tmp_path, MAX_WORKER_LOGS, "")
    assert _logs(tmp_path) == {}
    _worker(tmp_path, MAX_WORKER_LOGS, "nvcc said something")
    assert list(_logs(tmp_path).values()) == ["nvcc said something\n"]


def test_only_the_newest_logs_are_kept(tmp_path):
    for i in range(5):
        _worker(tmp_path, 3, f"run {i}")
    assert sorted(_logs(tmp_path).values()) == ["run 2\n", "run 3\n", "run 4\n"]


def test_rotation_keeps_running_workers_logs_and_removes_killed_workers_empty_ones(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (logs / f"worker-{sleeper.pid}.log").write_text("")  # running, nothing written yet
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        (logs / f"worker-{int(dead.stdout)}.log").write_text("")  # killed before writing
        for i in range(4):
            path = logs / f"worker-{999_000_000 + i}.log"  # finished, oldest first
            path.write_text(f"old {i}")
            os.utime(path, ns=(i * 10**9, i * 10**9))
        _rotate_worker_logs(logs, keep=3)
        assert sorted(p.name for p in logs.iterdir()) == sorted(
            [f"worker-{sleeper.pid}.log", "worker-999000002.log", "worker-999000003.log"])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_worker_keeps_at_most_the_default_number_of_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(MAX_WORKER_LOGS * 2):
        (logs / f"worker-{999_000_000 + i}.log").write_text(f"finished {i}")
    _worker(tmp_path, MAX_WORKER_LOGS, "the new one")
    assert len(_logs(tmp_path)) == MAX_WORKER_LOGS and "the new one\n" in _logs(
        tmp_path).values()


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
