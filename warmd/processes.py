"""Process helpers shared by the store, the cache and the cluster code."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs (a zombie does not; another user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def seconds_since_start() -> float | None:
    """How long this process has run (from /proc: its start in clock ticks since boot,
    against the uptime; 10 ms resolution); None where /proc does not say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(") ", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
