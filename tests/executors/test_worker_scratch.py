"""Each worker process has a private temp dir ($TMPDIR) that goes when the process goes: a
stop (killed or not) or a worker that died, during a task or between tasks, leaves nothing
of its compilers' intermediate files in the system's temp dir, and the compilers it started
are gone too. Pools whose process was killed before it could clean up leave directories
that a later pool removes (their lock free), never a running pool's. Real spawned
processes; the executor stands in for a compiler (tests/tmp_writer_executor.py; the real
nvcc case: tests/warmup/test_warmup_interrupt.py)."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import signal
import stat
import threading
import time

import pytest
from tmp_writer_executor import own_temp_dir

from warmd.executors import scratch
from warmd.executors.pool import Worker, stop_workers
from warmd.processes import pid_alive
from warmd.tasks import Task

TARGETS = {"flashinfer": "tmp_writer_executor:TmpWriterExecutor",
           "deep_gemm": "slow_exit_executor:SlowExitExecutor"}


@pytest.fixture
def base(tmp_path, monkeypatch):
    return own_temp_dir(tmp_path, monkeypatch)


def _worker(tmp_path) -> Worker:
    return Worker({"WARMD_STATE_DIR": str(tmp_path / "state"),
                   "WARMD_TEST_EXIT_DIR": str(tmp_path)}, executors=TARGETS)


def _run(worker: Worker, module: str = "ok"):
    return worker.run(Task("flashinfer", "k", module=module, key=f"flashinfer/{module}"))


def _said(worker: Worker, module: str = "ok") -> dict:
    result = _run(worker, module)
    assert result.ok, result.error
    return json.loads(result.error)


def _gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_a_workers_temp_dir_is_its_own_and_private(tmp_path, base):
    worker = _worker(tmp_path)
    said = _said(worker)
    path = base / os.path.basename(said["tmpdir"])
    assert said["tmpdir"] == str(path) and path.name.startswith(scratch.PREFIX)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    assert (path / "kernel.cpp1.ii").is_file()
    stop_workers([worker])
    assert _gone(said["child"])


def test_caches_libraries_keep_under_the_temp_dir_stay_where_they_were(tmp_path, base,
                                                                     monkeypatch):
    """torch inductor keeps a persistent cache under the temp dir by default: a worker's own
    temp dir must not take it away with it. CUTE_DSL_CACHE_DIR is left as the caller has it
    (unset: FlashInfer then sets its own, as in the engine)."""
    monkeypatch.delenv("CUTE_DSL_CACHE_DIR", raising=False)
    worker = _worker(tmp_path)
    said = _said(worker, "caches")
    stop_workers([worker])
    assert said == {"inductor": str(base / f"torchinductor_{getpass.getuser()}"),
                    "cute_dsl": None}


@pytest.mark.parametrize("kill", [False, True])
def test_a_stopped_worker_leaves_nothing_in_the_temp_dir(tmp_path, base, kill):
    workers = [_worker(tmp_path) for _ in range(2)]
    children = [_said(w)["child"] for w in workers]
    assert len(list(base.iterdir())) == 2
    stop_workers(workers, kill=kill)
    assert all(_gone(pid) for pid in children)
    assert list(base.iterdir()) == []


def test_a_worker_that_died_in_a_task_takes_its_compilers_and_temp_dir_along(tmp_path, base):
    worker = _worker(tmp_path)
    first = _said(worker)
    died = _run(worker, "die")
    assert not died.ok and "exit code 3" in died.error
    assert _gone(first["child"]) and list(base.iterdir()) == []
    after = _said(worker)  # restarted, with a fresh temp dir
    assert after["tmpdir"] != first["tmpdir"] and os.path.isdir(after["tmpdir"])
    stop_workers([worker])
    assert _gone(after["child"]) and list(base.iterdir()) == []


def test_a_worker_that_died_between_tasks_is_cleaned_up_at_the_next(tmp_path, base):
    worker = _worker(tmp_path)
    first = _said(worker)
    os.kill(worker.pid, signal.SIGKILL)
    assert _gone(worker.pid)
    after = _said(worker)
    assert _gone(first["child"]) and not os.path.exists(first["tmpdir"])
    stop_workers([worker])
    assert _gone(after["child"]) and list(base.iterdir()) == []


def test_a_second_stop_leaves_the_first_ones_process_and_temp_dir_alone(tmp_path, base):
    """A stage's kill comes while a graceful stop waits for the same worker to exit: the
    process is the first stop's to end, and its temp dir is not removed under it."""
    worker = _worker(tmp_path)
    assert worker.run(Task("deep_gemm", "k", key="deep_gemm/slow")).ok  # exits in 1 s
    said = _said(worker)
    pid = worker.pid
    first = threading.Thread(target=stop_workers, args=([worker],))
    first.start()
    time.sleep(0.2)  # the first stop is waiting for the exit
    stop_workers([worker], kill=True)
    assert pid_alive(pid) and os.path.isdir(said["tmpdir"])
    first.join(10)
    assert not pid_alive(pid) and list(base.iterdir()) == []


def _left_dir(base, name: str, age: float = 2 * scratch.ORPHAN_AFTER_SECONDS):
    path = base / f"{scratch.PREFIX}{name}"
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "tmpxft_1.ii").write_text("left by a killed nvcc")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_gone_pools_leftovers_are_removed_by_the_next_pool(tmp_path, base):
    """Gone: its lock is free (whatever pid its name has: a pool in another container
    sharing the temp dir has pids this one cannot see). Kept: one whose lock is held, one
    made just now (locked an instant after it is made), a link."""
    orphaned = _left_dir(base, "1-abc")
    held = _left_dir(base, f"{os.getpid()}-held")
    new = _left_dir(base, "2-new", age=0.0)
    link = base / f"{scratch.PREFIX}3-link"
    link.symlink_to(orphaned)
    holder = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another process's pool, running
        worker = _worker(tmp_path)
        said = _said(worker)
        stop_workers([worker])
    finally:
        os.close(holder)
    assert not orphaned.exists() and not os.path.exists(said["tmpdir"])
    assert sorted(p.name for p in base.iterdir()) == sorted([held.name, new.name, link.name])


def test_a_running_pools_directories_are_not_taken_by_another(tmp_path, base):
    first = _worker(tmp_path)
    said = _said(first)
    old = time.time() - 2 * scratch.ORPHAN_AFTER_SECONDS
    os.utime(said["tmpdir"], (old, old))
    scratch._remove_orphans.cache_clear()  # the second pool: a process of its own
    second = _worker(tmp_path)
    _said(second)
    assert os.path.isdir(said["tmpdir"])
    stop_workers([first, second])
    assert list(base.iterdir()) == []
