"""Worker processes that run tasks, one at a time each.

Workers are spawned (never forked from a process that may hold CUDA or Redis state), get
their environment (cache dirs, arch, CUDA_VISIBLE_DEVICES) before importing any JIT
library, and exchange tasks and results with the parent as JSON over a pipe. Each worker
leads its own process group so that stopping it also stops the ninja/nvcc it started.
Executors are created in the worker with no arguments, from the environment it was given.
Each worker process has its own temporary directory ($TMPDIR), removed once the process is
gone: nvcc and gcc leave their intermediate files there when they are killed (a stop, a
worker that died), megabytes a build, which would otherwise pile up in the system's /tmp.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import multiprocessing
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.processes import pid_alive
from warmd.stats import Outcome
from warmd.tasks import Task

STOP_GRACE_SECONDS = 3.0
SCRATCH_PREFIX = "warmd-worker-"  # <temp dir>/warmd-worker-<pid of the pool's process>-<random>
OWNER_LOCK = ".owner"  # in each: flock'ed by the pool's process while the directory is in use
ORPHAN_WITHOUT_LOCK_SECONDS = 3600.0
MAX_WORKER_LOGS = 20  # logs of finished workers kept in <state dir>/logs, newest first


def load_executor(library: str, target: str | None = None) -> Executor | str:
    """The library's executor (or the "module:Class" target given instead), checked; or
    the reason it cannot run here."""
    from warmd.libraries import LIBRARIES
    from warmd.libraries.base import names_module, resolve

    registered = LIBRARIES.get(library)
    if registered is None:
        return f"no executor for library {library!r}"
    try:
        plugin = registered.plugin()
        if not plugin.plans_tasks:
            return f"no executor for library {library!r}"
        executor = resolve(target)() if target else plugin.make_executor()
        ok, reason = executor.check()
    except ModuleNotFoundError as exc:
        if names_module(exc, target or registered.plugin_module):
            return f"this warmd has no {library} executor ({exc.name} is missing)"
        return f"{library} executor cannot be imported: {exc}"
    except ImportError as exc:
        return f"{library} executor cannot be imported: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return f"{library} executor cannot start: {type(exc).__name__}: {exc}"
    return executor if ok else f"{library} cannot run here: {reason}"


def failed_result(task: Task, reason: str, seconds: float = 0.0) -> TaskResult:
    return TaskResult(task.key, task.library, False, seconds,
                      [KernelOutcome(task.module or task.kernel, Outcome.FAILED, seconds)],
                      reason)


def result_from_json(data: dict) -> TaskResult:
    kernels = [KernelOutcome(**k) for k in data.get("kernels", [])]
    return TaskResult(data["task_key"], data["library"], bool(data["ok"]),
                      float(data["seconds"]), kernels, data.get("error"))


def run_task(executors: dict[str, Executor | str], task: Task,
             targets: dict[str, str] | None = None) -> TaskResult:
    """Run one task with the library's (cached) executor, or the one ``targets`` names for
    its library; never raises."""
    if task.library not in executors:
        executors[task.library] = load_executor(task.library,
                                                (targets or {}).get(task.library))
    executor = executors[task.library]
    if isinstance(executor, str):
        return failed_result(task, executor)
    try:
        return executor.run(task)
    except Exception as exc:  # executors should not raise; one that does fails its task only
        return failed_result(task, f"{type(exc).__name__}: {exc}")


def _set_parent_death_signal() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent


def _log_output_to_file() -> Path | None:
    """Compiler and library chatter goes to <state dir>/logs/worker-<pid>.log, not the
    parent's terminal (failures reach the report with their reasons). Logs are rotated
    first (``_rotate_worker_logs``); a log this worker wrote nothing to is removed when it
    exits (``_drop_if_empty``; if it was killed, by the next worker's rotation). Returns
    the log's path (None when it could not be opened)."""
    from warmd import settings

    log_dir = settings.state_dir() / "logs"
    path = log_dir / f"worker-{os.getpid()}.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        _rotate_worker_logs(log_dir, MAX_WORKER_LOGS)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return None
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return path


def _rotate_worker_logs(log_dir: Path, keep: int) -> None:
    """Of the logs of workers that are gone, remove the empty ones and all but the newest
    keep - 1 (room for the log about to be opened); running workers' logs stay."""
    finished = []
    for path in log_dir.glob("worker-*.log"):
        pid = path.stem.removeprefix("worker-")
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if st.st_size == 0:
            _remove_if_empty(path)
        else:
            finished.append((st.st_mtime_ns, path.name, path))
    for _mtime, _name, path in sorted(finished, reverse=True)[max(keep - 1, 0):]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()


def _drop_if_empty(log: Path | None) -> None:
    """A worker that said nothing leaves no log (one empty file per worker ever started
    would pile up in the state dir)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()  # Python's own buffered output belongs in it too
        sys.stderr.flush()
    if log is not None:
        _remove_if_empty(log)


def _worker_main(conn: Connection, env: dict[str, str], targets: dict[str, str]) -> None:
    os.setpgrp()
    _set_parent_death_signal()
    from warmd.cache.rederived import without_secrets

    kept = without_secrets({**os.environ, **env})  # a worker compiles; it never publishes
    os.environ.clear()
    os.environ.update(kept)
    log = _log_output_to_file()
    try:
        _serve(conn, targets)
    finally:
        _drop_if_empty(log)


def _serve(conn: Connection, targets: dict[str, str]) -> None:
    """Run the tasks the pool sends until it sends nothing (or goes away)."""
    executors: dict[str, Executor | str] = {}
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not raw:
            return
        task = Task.from_json(json.loads(raw))
        result = run_task(executors, task, targets)
        conn.send_bytes(json.dumps(asdict(result)).encode())


def new_scratch(env: dict[str, str]) -> tuple[Path, int]:
    """A fresh private directory for one worker process and what it starts, under the
    worker environment's TMPDIR (else this process's temp dir), and the descriptor of its
    owner lock, held until the directory is removed; the leftovers of pools that are gone
    are removed first, once per temp dir."""
    base = Path(env.get("TMPDIR") or tempfile.gettempdir())
    _remove_orphaned_scratch(base)
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=base))
    try:
        fd = os.open(path / OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


@functools.cache
def _remove_orphaned_scratch(base: Path) -> None:
    """Remove the worker directories whose pool is gone (killed before it could clean up):
    this user's own, never a link, and only when their owner lock is free. A lock, not the
    pid in the name: another container sharing the temp dir has pids this one cannot see."""
    for path in base.glob(f"{SCRATCH_PREFIX}*"):
        if _orphaned(path):
            shutil.rmtree(path, ignore_errors=True)


def _orphaned(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    try:
        fd = os.open(path / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # being made this instant, or its maker died right then
        return time.time() - st.st_mtime > ORPHAN_WITHOUT_LOCK_SECONDS
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Worker:
    """One worker process; restarted when it dies, its task then failing with the reason.

    The process starts on the first task, not before: a run whose tasks all finish without
    a library (verified hits) starts none. ``env`` may be a function giving the environment
    then (working it out can mean probing GPUs and compilers). ``executors`` maps a library
    to another "module:Class" executor for it (a discovery pass, say)."""

    def __init__(self, env: dict[str, str] | Callable[[], dict[str, str]],
                 executors: dict[str, str] | None = None) -> None:
        self._env = env if callable(env) else dict(env)
        self.executors = dict(executors or {})
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn: Connection | None = None
        self._scratch: Path | None = None  # the running process's $TMPDIR
        self._scratch_lock: int | None = None  # its owner lock's descriptor
        self._starts = 0
        self.stopped = False

    @property
    def env(self) -> dict[str, str]:
        if callable(self._env):
            self._env = dict(self._env())
        return self._env

    @property
    def started(self) -> bool:
        """Whether a process was ever started for this worker."""
        return self._starts > 0

    def _start(self, env: dict[str, str]) -> None:
        parent, child = self._ctx.Pipe()
        self._starts += 1
        with contextlib.suppress(OSError):  # no temp dir to make one in: the inherited one
            self._scratch, self._scratch_lock = new_scratch(env)
            env = {**env, "TMPDIR": str(self._scratch)}
        self._proc = self._ctx.Process(target=_worker_main,
                                       args=(child, env, self.executors), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def run(self, task: Task) -> TaskResult:
        if self.stopped:
            return failed_result(task, "interrupted before it started")
        if self._proc is None or not self._proc.is_alive():
            env = self.env  # worked out first: it may wait (a kernel stage holding workers)
            if self.stopped:  # stopped meanwhile: start nothing
                return failed_result(task, "interrupted before it started")
            self._start(env)
        proc, conn = self._proc, self._conn
        assert proc is not None and conn is not None
        try:
            conn.send_bytes(json.dumps(task.to_json()).encode())
            return result_from_json(json.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            proc.join(timeout=STOP_GRACE_SECONDS)
            if self._proc is proc:  # died on its own: what it started goes with it
                _kill_group(proc.pid, signal.SIGKILL)
                self._proc = self._conn = None
                self._drop_scratch()
            if self.stopped:
                return failed_result(task, "interrupted")
            return failed_result(task, f"worker process died (exit code {proc.exitcode})")

    def stop(self, kill: bool = False) -> None:
        """Ask the worker to exit; kill its whole process group (ninja, nvcc) when told to,
        or when it does not exit within the grace period."""
        stop_workers([self], kill)

    def _ask_to_exit(self, kill: bool) -> multiprocessing.process.BaseProcess | None:
        """Mark the worker stopped and, unless it is to be killed, ask its process to exit;
        the process, if one ran."""
        self.stopped = True
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None and not kill and conn is not None:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"")
        return proc

    def _drop_scratch(self) -> None:
        scratch, lock = self._scratch, self._scratch_lock
        self._scratch = self._scratch_lock = None
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            if scratch.exists():  # a killed compiler finished one last write as it died
                time.sleep(0.05)
                shutil.rmtree(scratch, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def stop_workers(workers: list[Worker], kill: bool = False) -> None:
    """Stop these workers together: every one asked to exit first, then waited for within
    one grace period shared by all (a worker holding a CUDA context takes a moment to exit:
    one after the other, those moments would add up), then what is left killed with its
    process group (ninja, nvcc); their temporary directories are removed last."""
    procs = [proc for w in workers if (proc := w._ask_to_exit(kill)) is not None]
    if not kill:
        _join_all(procs)
    left = [proc for proc in procs if kill or proc.is_alive()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in left:
            _kill_group(proc.pid, sig)
        _join_all(left)
    for worker in workers:
        worker._drop_scratch()


def _join_all(procs: list[multiprocessing.process.BaseProcess]) -> None:
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
