"""Worker processes that run tasks, one at a time each.

Workers are spawned (never forked from a process that may hold CUDA or Redis state), get
their environment (cache dirs, arch, CUDA_VISIBLE_DEVICES) before importing any JIT
library, and exchange tasks and results with the parent as JSON over a pipe. Each worker
leads its own process group so that stopping it also stops the ninja/nvcc it started.
Executors are created in the worker with no arguments, from the environment it was given.
Each worker process has its own temp dir ($TMPDIR), removed once the process is gone
(warmd.executors.scratch).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.executors.scratch import Scratch, caches_outside, make_scratch
from warmd.processes import pid_alive
from warmd.stats import Outcome
from warmd.tasks import Task

STOP_GRACE_SECONDS = 3.0
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


@dataclass
class _Running:
    """A worker's process, the pipe to it and its temp dir (None: the inherited one)."""

    proc: multiprocessing.process.BaseProcess
    conn: Connection
    scratch: Scratch | None

    def ended(self, stop_group: bool) -> None:
        """The process is gone, or is to go: when told so, it and what it started are
        stopped as a stop does (TERM, which a library's executor answers by removing its
        half-made build, then KILL after the grace period), then its temp dir goes."""
        if stop_group:
            _kill_group(self.proc.pid, signal.SIGTERM)
            self.proc.join(timeout=STOP_GRACE_SECONDS)
        # what it started and left running (after an exit as asked too) holds its temp dir
        _kill_group(self.proc.pid, signal.SIGKILL)
        self.proc.join(timeout=STOP_GRACE_SECONDS)
        if self.scratch is not None:
            self.scratch.remove(self.proc.pid)


class Worker:
    """One worker process; restarted when it dies, its task then failing with the reason.

    The process starts on the first task, not before: a run whose tasks all finish without
    a library (verified hits) starts none. ``env`` may be a function giving the environment
    then (working it out can mean probing GPUs and compilers). ``executors`` maps a library
    to another "module:Class" executor for it (a discovery pass, say). A task still running
    after ``timeout`` seconds is killed with everything it started, and fails. Whoever takes
    the running process (the task's thread when it died or ran too long, a stop) ends it and
    removes its temp dir, once."""

    def __init__(self, env: dict[str, str] | Callable[[], dict[str, str]],
                 executors: dict[str, str] | None = None,
                 timeout: float | None = None) -> None:
        self._env = env if callable(env) else dict(env)
        self.executors = dict(executors or {})
        self.timeout = timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._running: _Running | None = None
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

    @property
    def pid(self) -> int | None:
        """The running process's pid."""
        running = self._running
        return running.proc.pid if running is not None else None

    def _start(self, env: dict[str, str]) -> _Running | None:
        """Start the process (None when the worker was stopped meanwhile)."""
        base = Path(env.get("TMPDIR") or tempfile.gettempdir())
        scratch = None
        with contextlib.suppress(OSError):  # no temp dir to make one in: the inherited one
            scratch = make_scratch(base)
            pinned = {k: v for k, v in caches_outside(base).items()
                      if k not in env and k not in os.environ}
            env = {**pinned, **env, "TMPDIR": str(scratch.path)}
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, env, self.executors),
                                 daemon=True)
        running = None
        with self._lock:
            if not self.stopped:
                proc.start()
                self._starts += 1
                running = self._running = _Running(proc, parent, scratch)
        child.close()
        if running is None:
            parent.close()
            if scratch is not None:
                scratch.remove()
        return running

    def _take(self, running: _Running) -> bool:
        """Take this process from the worker, unless a stop took it first."""
        with self._lock:
            if self._running is not running:
                return False
            self._running = None
            return True

    def run(self, task: Task) -> TaskResult:
        if self.stopped:
            return failed_result(task, "interrupted before it started")
        running = self._running
        if running is not None and not running.proc.is_alive() and self._take(running):
            running.ended(stop_group=True)  # it died between tasks
            running = None
        if running is None:
            env = self.env  # worked out first: it may wait (a kernel stage holding workers)
            running = None if self.stopped else self._start(env)
            if running is None:  # stopped meanwhile: start nothing
                return failed_result(task, "interrupted before it started")
        try:
            running.conn.send_bytes(json.dumps(task.to_json()).encode())
            if self.timeout is not None and not running.conn.poll(self.timeout):
                return self._timed_out(task, running)
            return result_from_json(json.loads(running.conn.recv_bytes()))
        except (EOFError, OSError):
            running.proc.join(timeout=STOP_GRACE_SECONDS)
            if self._take(running):  # died on its own: what it started goes with it
                running.ended(stop_group=True)
            if self.stopped:
                return failed_result(task, "interrupted")
            return failed_result(task, f"worker process died (exit code "
                                       f"{running.proc.exitcode})")

    def _timed_out(self, task: Task, running: _Running) -> TaskResult:
        if self._take(running):  # else a stop took it meanwhile: the stop ends it
            running.ended(stop_group=True)
        if self.stopped:
            return failed_result(task, "interrupted")
        return failed_result(task, f"timed out after {self.timeout:g} s (its process and "
                                   f"compilers killed; --task-timeout, WARMD_TASK_TIMEOUT)",
                             self.timeout or 0.0)

    def stop(self, kill: bool = False) -> None:
        """Ask the worker to exit; kill its whole process group (ninja, nvcc) when told to,
        or when it does not exit within the grace period."""
        stop_workers([self], kill)

    def _ask_to_exit(self, kill: bool) -> _Running | None:
        """Mark the worker stopped, take its process and, unless it is to be killed, ask
        it to exit; the process, if one ran and no one else took it."""
        with self._lock:
            self.stopped = True
            running, self._running = self._running, None
        if running is not None and not kill:
            with contextlib.suppress(OSError):
                running.conn.send_bytes(b"")
        return running


def stop_workers(workers: list[Worker], kill: bool = False) -> None:
    """Stop these workers together: every one asked to exit first, then waited for within
    one grace period shared by all (a worker holding a CUDA context takes a moment to exit:
    one after the other, those moments would add up), then what is left killed with its
    process group (ninja, nvcc); the temp dirs of the processes this call took are removed
    last."""
    taken = [running for w in workers if (running := w._ask_to_exit(kill)) is not None]
    procs = [running.proc for running in taken]
    if not kill:
        _join_all(procs)
    left = [proc for proc in procs if kill or proc.is_alive()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in left:
            _kill_group(proc.pid, sig)
        _join_all(left)
    for running in taken:
        running.ended(stop_group=False)


def _join_all(procs: list[multiprocessing.process.BaseProcess]) -> None:
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
