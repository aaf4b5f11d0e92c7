"""A task still running after the worker's timeout (a hung compiler, a hung library call) is
killed with everything it started and fails with that reason; the worker's next task runs
in a fresh process. Real spawned processes; the executor stands in for a compiler that never
ends (tests/tmp_writer_executor.py)."""

from __future__ import annotations

import time

import pytest
from tmp_writer_executor import own_temp_dir

from warmd.executors.pool import Worker, stop_workers
from warmd.processes import pid_alive
from warmd.tasks import Task

TARGETS = {"flashinfer": "tmp_writer_executor:TmpWriterExecutor"}


@pytest.fixture
def base(tmp_path, monkeypatch):
    return own_temp_dir(tmp_path, monkeypatch)


def _run(worker: Worker, module: str):
    return worker.run(Task("flashinfer", "k", module=module, key=f"flashinfer/{module}"))


def test_a_task_past_its_timeout_is_killed_with_its_compilers_and_fails(tmp_path, base):
    worker = Worker({"WARMD_STATE_DIR": str(tmp_path / "state")}, executors=TARGETS,
                    timeout=2.0)
    began = time.monotonic()
    result = _run(worker, "hang")
    took = time.monotonic() - began
    assert not result.ok and result.error.startswith("timed out after 2 s")
    assert "WARMD_TASK_TIMEOUT" in result.error and result.seconds == 2.0
    assert 2.0 <= took < 30
    child = int((base / "hung-child").read_text())
    assert not pid_alive(child)  # the hung compiler is gone with it
    assert [p.name for p in base.iterdir()] == ["hung-child"]  # and its temp dir
    after = _run(worker, "ok")
    assert after.ok, after.error  # a fresh process
    stop_workers([worker])


def test_a_task_within_its_timeout_is_untouched(tmp_path, base):
    worker = Worker({"WARMD_STATE_DIR": str(tmp_path / "state")}, executors=TARGETS,
                    timeout=60.0)
    first = _run(worker, "ok")
    pid = worker.pid
    assert first.ok and _run(worker, "ok").ok and worker.pid == pid
    stop_workers([worker])
