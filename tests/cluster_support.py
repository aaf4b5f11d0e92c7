"""A private machine for tests that run `warmd start` without --address: its own HOME (state
dir, caches), its own Ray temp dir (RAY_TMPDIR, so a cluster that a user's `ray start` or
warmd daemon runs on this machine is never found) and no warmd/Ray variables of the caller."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def private_machine(home: Path) -> Iterator[dict]:
    # Ray puts unix sockets under RAY_TMPDIR: the path must stay short.
    ray_tmp = tempfile.mkdtemp(prefix="wr-", dir="/tmp")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WARMD_", "RAY_", "FLASHINFER_", "DG_JIT_", "VLLM_", "XDG_"))}
    try:
        yield {**env, "HOME": str(home), "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp}
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def warmd(env: dict, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def warmd_popen(env: dict, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warmd", *args], env=env, text=True,
                            **kwargs)


def until(check, timeout: float = 120, interval: float = 0.5):
    """check()'s first true value, polling; AssertionError when none comes in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")
