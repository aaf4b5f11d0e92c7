"""Builds a plan's FlashInfer modules through FlashInfer's own JIT specs.

A task names the module it expects (``task.module``) and how FlashInfer makes its spec
(``task.spec = {"generator": "module.path:function", "args": [...]}``; dtype names such as
"bfloat16" become torch dtypes). The spec's ``build()`` lands the module exactly where the
engine's FlashInfer looks; on a GPU whose arch is the target's, ``build_and_load()`` also
loads it. Without one it cross-builds for the target arch: FlashInfer only needs nvcc.

FlashInfer reads FLASHINFER_WORKSPACE_BASE and FLASHINFER_CUDA_ARCH_LIST when it is first
imported, so the environment is prepared by ``worker_env`` and applied by the worker pool in
the worker process before this executor imports flashinfer; nothing leaks into the caller.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from warmd import knobs, settings
from warmd.cache.base import UnsafeArtifact
from warmd.cache.safe_fs import CacheTree
from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.libraries.base import resolve
from warmd.libraries.flashinfer.cache import (
    FlashInferCacheAdapter,
    arch_dir,
    flashinfer_version,
)
from warmd.libraries.flashinfer.ninja import parse_ninja_log
from warmd.stats import Outcome
from warmd.tasks import Task

LIBRARY = "flashinfer"
_REASON_CHARS = 600
MAX_NINJA_LOG_BYTES = 64 << 20  # one line per command: far above any module's
log = logging.getLogger("warmd.flashinfer")


def _links_libcuda(home: Path) -> bool:
    """Whether `-lcuda` resolves the way FlashInfer links (toolkit lib64, lib64/stubs)."""
    out = settings.state_dir() / f".libcuda-probe-{os.getpid()}.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [settings.cxx(), "-x", "c", "-", "-shared", "-o", str(out),
             f"-L{home / 'lib64'}", f"-L{home / 'lib64' / 'stubs'}", "-lcuda"],
            input="", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        out.unlink(missing_ok=True)
    return proc.returncode == 0


def stub_libcuda_dir() -> Path:
    """A directory holding an empty libcuda.so to link against on machines without a driver
    (the module's symbols resolve against the real driver when a GPU node loads it)."""
    stub_dir = settings.state_dir() / "stubs"
    stub = stub_dir / "libcuda.so"
    if stub.exists():
        return stub_dir
    stub_dir.mkdir(parents=True, exist_ok=True)
    tmp = stub_dir / f".libcuda.{uuid.uuid4().hex[:8]}.so"
    subprocess.run(["gcc", "-x", "c", "-", "-shared", "-o", str(tmp)], input="",
                   capture_output=True, text=True, timeout=60, check=True)
    os.replace(tmp, stub)
    return stub_dir


def curand_include_dir() -> Path | None:
    """nvidia-curand's headers (some modules include curand_kernel.h) when the toolkit
    lacks them."""
    if (settings.cuda_home() / "include" / "curand_kernel.h").exists():
        return None
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in sorted(Path(base).glob("cu*/include")) + [Path(base) / "curand" / "include"]:
            if (sub / "curand_kernel.h").exists():
                return sub
    return None


def _prepend(env: dict[str, str], var: str, value: str) -> None:
    current = env.get(var, knobs.get(var) or "")
    env[var] = f"{value}:{current}" if current else value


def worker_env(target_arch: str, workspace_base: Path) -> dict[str, str]:
    """Environment for a worker that builds FlashInfer modules for target_arch ('9.0a') on
    this node: the arch is set only when no local GPU has it (on such a GPU FlashInfer's own
    detection agrees, and the module is also loaded).

    The stub libcuda goes on LIBRARY_PATH and curand's headers on CPATH rather than into
    FLASHINFER_EXTRA_LDFLAGS/CUDAFLAGS: those flags enter the build commands, and a command
    that differs from the GPU node's makes ninja rebuild the module there.
    """
    from warmd.targets import detect_local_gpus

    env = {"FLASHINFER_WORKSPACE_BASE": str(workspace_base)}
    home = settings.cuda_home()
    if not knobs.is_set("CUDA_HOME") and (home / "bin" / "nvcc").exists():
        env["CUDA_HOME"] = str(home)
    wanted = settings.flashinfer_arch_list() or target_arch
    if arch_dir(wanted) not in {arch_dir(g.arch) for g in detect_local_gpus()}:
        env["FLASHINFER_CUDA_ARCH_LIST"] = wanted
    if not _links_libcuda(home):
        _prepend(env, "LIBRARY_PATH", str(stub_libcuda_dir()))
    curand = curand_include_dir()
    if curand is not None:
        _prepend(env, "CPATH", str(curand))
    return env


def _convert_args(args) -> list:
    import torch

    out = []
    for arg in args or ():
        dtype = getattr(torch, arg, None) if isinstance(arg, str) else None
        out.append(dtype if isinstance(dtype, torch.dtype) else arg)
    return out


# Where a tool's diagnostic points (never what it says: ninja quotes the lines it could not
# parse, compilers the tokens they could not compile, and a build.ninja that includes a
# node's file, or a source that #includes one, makes either echo that file):
#   nvcc   /path/x.cu(12): error: ...        gcc/clang  /path/x.cc:12:5: fatal error: ...
#   ninja  ninja: error: /path/build.ninja:3: ...   FAILED: [code=1] /path/x.cuda.o
_WHERE = r"[^\s:()]+(?:\(\d+\)|:\d+)(?::\d+)?"  # file(line), file:line or file:line:col
_DIAGNOSTIC = re.compile(rf"^(?:(?P<at>{_WHERE}):? (?:fatal )?error\b"
                         rf"|ninja: error: (?P<ninja>{_WHERE}):)")
_FAILED_TARGET = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<target>\S+)")  # ninja >= 1.12
_MAX_SHOWN = 3


def _short_reason(exc: BaseException) -> str:
    """What went wrong, bounded and in warmd's words: the exception's first line; for tool
    output (a failed ninja build) only where it failed (targets, file:line of each error),
    never the tools' messages, which may quote any file the build read. The whole output
    goes to this worker's log only."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if len(lines) <= 1:
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:_REASON_CHARS]
    log.warning("%s: %s", type(exc).__name__, exc)  # this node's worker log, not the reason
    failed, errors = [], []
    for line in lines[1:]:
        target, diagnostic = _FAILED_TARGET.match(line), _DIAGNOSTIC.match(line)
        if target:
            failed.append(Path(target["target"]).name)
        elif diagnostic:
            errors.append(diagnostic["at"] or diagnostic["ninja"])
    detail = lines[0].rstrip(":").removesuffix(" Ninja output").rstrip(".")
    if failed:
        detail += f"; failed: {_shown(failed)}"
    if errors:
        detail += f"; errors at {_shown(errors)}"
    detail += " (the tools' messages are in the worker log: they may quote the files read)"
    return f"{type(exc).__name__}: {detail}"[:_REASON_CHARS]


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM, which stops a warmup's workers (their whole process group, ninja and nvcc
    with them), raises KeyboardInterrupt here while a build runs, so that it can clean up
    before the process ends. Only in the main thread, where signal handlers live."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum, _frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Leftovers:
    """What an interrupted build of a spec leaves that this build made: the module's build
    directory (build.ninja, objects) or, in one that was there, its build.ninja; and the
    module's lock file. Nothing is removed once the module is complete, and the lock file
    only when nobody holds it."""

    def __init__(self, spec) -> None:
        self.spec = spec
        self.paths = {name: getattr(spec, name, None)
                      for name in ("build_dir", "ninja_path", "lock_path")}
        self.existed = {name for name, path in self.paths.items()
                        if path is not None and Path(path).exists()}

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # a best effort while the process ends
            if not self.spec.is_compiled:
                self._remove_build()
            self._remove_lock()

    def _fresh(self, name: str) -> Path | None:
        path = self.paths[name]
        return Path(path) if path is not None and name not in self.existed else None

    def _remove_build(self) -> None:
        build_dir, ninja = self._fresh("build_dir"), self._fresh("ninja_path")
        if build_dir is not None:
            shutil.rmtree(build_dir, ignore_errors=True)
        elif ninja is not None:
            ninja.unlink(missing_ok=True)

    def _remove_lock(self) -> None:
        lock = self._fresh("lock_path")
        if lock is None or not lock.exists():
            return
        with open(lock, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another build holds it: it is theirs
                return
            lock.unlink(missing_ok=True)


def _shown(items: list[str]) -> str:
    unique = list(dict.fromkeys(items))
    more = len(unique) - _MAX_SHOWN
    return ", ".join(unique[:_MAX_SHOWN]) + (f" and {more} more" if more > 0 else "")


class FlashInferExecutor(Executor):
    library = LIBRARY

    def __init__(self, workspace_base: Path | None = None, arch: str | None = None) -> None:
        self.workspace_base = Path(workspace_base or settings.flashinfer_workspace_base())
        self.arch = arch or settings.flashinfer_arch_list()
        self._adapter: FlashInferCacheAdapter | None = None

    def cache(self) -> FlashInferCacheAdapter:
        if self._adapter is None:
            self._adapter = FlashInferCacheAdapter(self.workspace_base,
                                                   self.arch or self._local_arch() or "9.0a")
        return self._adapter

    def _local_arch(self) -> str | None:
        try:
            import torch

            if not torch.cuda.is_available():
                return None
            major, minor = torch.cuda.get_device_capability(0)
        except Exception:
            return None
        from warmd.targets import arch_with_suffix

        return arch_with_suffix((major, minor))

    def can_load(self) -> bool:
        """Load after building only on a GPU whose arch is the one built for."""
        local = self._local_arch()
        return local is not None and arch_dir(local) == self.cache().arch

    def check(self) -> tuple[bool, str]:
        if flashinfer_version() is None:
            return False, "flashinfer is not installed (pip install flashinfer-python)"
        if shutil.which("ninja") is None:
            return False, "ninja is not on PATH (pip install ninja)"
        nvcc = settings.cuda_home() / "bin" / "nvcc"
        if not nvcc.exists():
            return False, f"nvcc not found at {nvcc} (set CUDA_HOME)"
        try:
            from flashinfer.jit import env as jit_env
        except Exception as exc:  # a broken install, an ABI mismatch with torch...
            return False, f"cannot import flashinfer.jit: {_short_reason(exc)}"
        expected = self.cache().workspace_dir.resolve()
        if Path(jit_env.FLASHINFER_WORKSPACE_DIR).resolve() != expected:
            return False, (f"flashinfer was imported with workspace "
                           f"{jit_env.FLASHINFER_WORKSPACE_DIR}, expected {expected}: set "
                           "FLASHINFER_WORKSPACE_BASE and the arch before importing it")
        return True, "ok"

    def run(self, task: Task) -> TaskResult:
        started = time.perf_counter()

        def failed(reason: str) -> TaskResult:
            elapsed = time.perf_counter() - started
            return TaskResult(task.key, LIBRARY, False, elapsed,
                              [KernelOutcome(task.module or "?", Outcome.FAILED, elapsed)],
                              reason)

        generator = task.spec.get("generator", "")
        try:
            spec = resolve(generator)(*_convert_args(task.spec.get("args")))
        except Exception as exc:
            return failed(f"FlashInfer generator {generator or '(none)'} failed: "
                          f"{_short_reason(exc)}")
        if spec.name != task.module:
            return failed(f"planner/FlashInfer drift: the plan expects module {task.module!r}, "
                          f"but {generator} of flashinfer {flashinfer_version()} makes "
                          f"{spec.name!r}")
        return self._build(task, spec, started, failed)

    def ninja_log(self, module: str) -> dict:
        """The latest .ninja_log entry per output of a module (empty when there is none, or
        when it is not a regular file reached without links: read through CacheTree, so a
        planted FIFO or link is never opened or followed)."""
        try:
            data = CacheTree(self.cache().root).read(f"{module}/.ninja_log",
                                                     MAX_NINJA_LOG_BYTES).data
        except (OSError, UnsafeArtifact):
            return {}
        return parse_ninja_log(data.decode(errors="replace"))[1]

    def _build(self, task: Task, spec, started: float, failed) -> TaskResult:
        before = self.ninja_log(spec.name)
        leftovers = _Leftovers(spec)
        try:
            with _terminate_raises():
                if self.can_load():
                    spec.build_and_load()
                else:
                    spec.build(need_lock=True)
        except KeyboardInterrupt:  # the warmup is stopping: leave no half-made module
            leftovers.remove()
            raise
        except Exception as exc:
            return failed(f"building {spec.name} failed: {_short_reason(exc)}")
        elapsed = time.perf_counter() - started
        after = self.ninja_log(spec.name)
        compiled = after != before  # ninja appends a log line for every command it ran
        outcome = KernelOutcome(spec.name, Outcome.COMPILED if compiled else Outcome.LOCAL_HIT,
                                elapsed if compiled else 0.0)
        return TaskResult(task.key, LIBRARY, True, elapsed, [outcome])
