"""`warmd warmup` as an operator sees it in a terminal of 80 columns, with the shared cache
on (the default): the module being built has its own live line while nvcc runs. The
warmup runs in a real pseudo-terminal against a real Redis-protocol server and builds a
real FlashInfer module; the test stops it once the line is seen (no full build)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS
from store_support import start_test_server

from warmd.store import open_shared_cache

pytestmark = pytest.mark.slow  # starts a real FlashInfer build

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _compiler_running(workspace: Path) -> bool:
    """Whether a process of this build (ninja, nvcc) names the workspace's cache."""
    needle = str(workspace / ".cache").encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _read(fd: int, seconds: float) -> bytes:
    chunks = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_shared_cache_warmup_shows_the_module_being_built_at_80_columns(tmp_path):
    server = start_test_server(tmp_path)
    workspace = tmp_path / "ws"
    seeded = open_shared_cache(server.url)  # the cluster compiled this family before
    seeded.stats.record_compile_times({"flashinfer/act_and_mul": (2, 84.0)})
    seeded.close()
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"),
           "FLASHINFER_WORKSPACE_BASE": str(workspace), "WARMD_REDIS_URL": server.url,
           "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS],
                            stdin=child, stdout=child, stderr=child, env=env,
                            start_new_session=True)
    os.close(child)
    screen = b""
    try:
        deadline = time.monotonic() + 240
        while not _compiler_running(workspace):
            assert proc.poll() is None, _text(screen + _read(main, 0.5))
            assert time.monotonic() < deadline, "no build started"
            screen += _read(main, 0.2)
        built_at = time.monotonic()
        while "silu_and_mul" not in _text(screen) and time.monotonic() < built_at + 5:
            screen += _read(main, 0.25)
        shown = _text(screen)
        # before any work: what the plan holds and what compiling it took before
        assert "1 task(s) (flashinfer 1); compiling them took 42.0 s before" in \
            " ".join(shown.split()), shown[:1500]
        assert "warming flashinfer silu_and_mul" in shown, shown[-2000:]
        assert all(len(line) <= 80 for line in shown.splitlines()), shown[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        os.close(main)
        server.stop()


def _text(raw: bytes) -> str:
    """The terminal's output as lines: escape sequences dropped, carriage returns as line
    breaks (the live display redraws in place)."""
    return ANSI.sub("", raw.decode(errors="replace")).replace("\r", "\n")
