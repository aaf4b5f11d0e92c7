"""Each worker process has a private temp dir ($TMPDIR) that goes when the process goes: a
stop (killed or not) or a worker that died leaves nothing of its compilers' intermediate
files in the system's temp dir, and the compilers it started are gone too. Pools whose
process was killed before it could clean up leave directories that the next pool removes
(their owner lock free), never a running pool's.
Real spawned processes; the executor stands in for a compiler (tests/tmp_writer_executor.py;
the real nvcc case: tests/warmup/test_warmup_interrupt.py)."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time

import pytest

from warmd.executors import pool
from warmd.executors.pool import OWNER_LOCK, SCRATCH_PREFIX, Worker, stop_workers
from warmd.processes import pid_alive
from warmd.tasks import Task

TARGET = "tmp_writer_executor:TmpWriterExecutor"


@pytest.fixture
def base(tmp_path, monkeypatch):
    """The system's temp dir, as this test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    pool._remove_orphaned_scratch.cache_clear()
    return folder


def _worker(tmp_path) -> Worker:
    return Worker({"WARMD_STATE_DIR": str(tmp_path / "state")},
                  executors={"flashinfer": TARGET})


def _run(worker: Worker, module: str = "ok"):
    return worker.run(Task("flashinfer", "k", module=module, key=f"flashinfer/{module}"))


def _gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_a_workers_temp_dir_is_its_own_and_private(tmp_path, base):
    worker = _worker(tmp_path)
    said = json.loads(_run(worker).error)
    scratch = base / os.path.basename(said["tmpdir"])
    assert said["tmpdir"] == str(scratch) and scratch.name.startswith(SCRATCH_PREFIX)
    assert stat.S_IMODE(os.lstat(scratch).st_mode) == 0o700
    assert (scratch / "kernel.cpp1.ii").is_file()
    stop_workers([worker])
    assert _gone(said["child"])


@pytest.mark.parametrize("kill", [False, True])
def test_a_stopped_worker_leaves_nothing_in_the_temp_dir(tmp_path, base, kill):
    workers = [_worker(tmp_path) for _ in range(2)]
    children = [json.loads(_run(w).error)["child"] for w in workers]
    assert len(list(base.iterdir())) == 2
    stop_workers(workers, kill=kill)
    assert all(_gone(pid) for pid in children)
    assert list(base.iterdir()) == []


def test_a_worker_that_died_takes_its_compilers_and_temp_dir_with_it(tmp_path, base):
    worker = _worker(tmp_path)
    first = json.loads(_run(worker).error)
    died = _run(worker, "die")
    assert not died.ok and "exit code 3" in died.error
    assert not os.path.exists(first["tmpdir"])
    assert list(base.iterdir()) == []
    after = json.loads(_run(worker).error)  # restarted, with a fresh temp dir
    assert after["tmpdir"] != first["tmpdir"] and os.path.isdir(after["tmpdir"])
    stop_workers([worker])
    assert _gone(first["child"]) and _gone(after["child"])
    assert list(base.iterdir()) == []


def _left_dir(base, name: str, owner: str | None = "free", age: float = 0.0):
    path = base / f"{SCRATCH_PREFIX}{name}"
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "tmpxft_1.ii").write_text("left by a killed nvcc")
    if owner is not None:
        (path / OWNER_LOCK).write_text("")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_gone_pools_leftovers_are_removed_by_the_next_pool(tmp_path, base):
    """Gone: its owner lock is free (whatever pid its name has: a pool in another container
    sharing the temp dir has pids this one cannot see). Kept: a lock someone holds, a
    directory without a lock made just now, a link."""
    orphaned = _left_dir(base, "1-abc")
    lockless_old = _left_dir(base, "2-old", owner=None, age=2 * 3600)
    held = _left_dir(base, f"{os.getpid()}-held")
    lockless_new = _left_dir(base, "3-new", owner=None)
    link = base / f"{SCRATCH_PREFIX}4-link"
    link.symlink_to(held)
    with open(held / OWNER_LOCK) as holder:  # another process's pool, running
        fcntl.flock(holder, fcntl.LOCK_EX)
        worker = _worker(tmp_path)
        said = json.loads(_run(worker).error)
        stop_workers([worker])
    assert not orphaned.exists() and not lockless_old.exists()
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [held.name, lockless_new.name, link.name])
    assert not os.path.exists(said["tmpdir"])


def test_a_running_pools_directories_are_not_taken_by_another(tmp_path, base):
    """Two pools on one temp dir: the second one's sweep leaves the first one's running
    worker alone."""
    first = _worker(tmp_path)
    said = json.loads(_run(first).error)
    pool._remove_orphaned_scratch.cache_clear()  # the second pool: a process of its own
    second = _worker(tmp_path)
    _run(second)
    assert os.path.isdir(said["tmpdir"])
    stop_workers([first, second])
    assert list(base.iterdir()) == []
