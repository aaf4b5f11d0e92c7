"""Private temp dirs for the processes a worker pool starts.

nvcc and gcc write their intermediate files (``tmpxft_*``, megabytes a build) to $TMPDIR and,
when they are killed (a stop, a worker that died), leave them there: in the system's /tmp
they pile up. So each worker process gets its own directory, removed once the process and
everything it started are gone. The directory is flock'ed by the pool's process while in
use; a later pool removes those whose lock is free (their pool was killed before it could
clean up), never by the pid in a name: a pool in another container sharing the temp dir
has pids this one cannot see.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "warmd-worker-"  # <temp dir>/warmd-worker-<pid of the pool's process>-<random>
# A directory is made, then locked: one younger than this is never taken for an orphan.
ORPHAN_AFTER_SECONDS = 60.0
GROUP_EXIT_SECONDS = 2.0  # how long a killed process group is given to be gone


@dataclass
class Scratch:
    """One worker process's temp dir and the descriptor of the directory holding its lock
    (-1 once removed)."""

    path: Path
    fd: int

    def remove(self, group: int | None = None) -> None:
        """Remove the directory once the process group that wrote there is gone (a killed
        compiler's last write lands first; bounded), then let go of its lock."""
        fd, self.fd = self.fd, -1
        if fd < 0:  # removed already
            return
        if group is not None:
            _wait_for_group_exit(group, GROUP_EXIT_SECONDS)
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)


def make_scratch(base: Path) -> Scratch:
    """A fresh directory (0700) under base, locked; the directories of gone pools under
    base are removed first, once per base and process."""
    _remove_orphans(base)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Scratch(path, fd)


def caches_outside(base: Path) -> dict[str, str]:
    """Persistent caches libraries keep under the temp dir by default, pinned where they are
    without a worker's own temp dir, so that what a worker compiles into them outlives it
    as before: torch inductor's (<tmp>/torchinductor_<user>, its cache_dir_utils). CuTe
    DSL's default (<tmp>/<user>/cutlass_python_cache) is not pinned: FlashInfer sets its
    own CUTE_DSL_CACHE_DIR (under its workspace) unless one is set, and a pin would move
    FlashInfer's away from where the engine's FlashInfer puts it."""
    with contextlib.suppress(Exception):
        return {"TORCHINDUCTOR_CACHE_DIR": str(base / f"torchinductor_{getpass.getuser()}")}
    return {}


@functools.cache
def _remove_orphans(base: Path) -> None:
    for path in base.glob(f"{PREFIX}*"):
        _remove_if_orphaned(path)


def _remove_if_orphaned(path: Path) -> None:
    """Remove path when it is this user's own directory (never a link), older than
    ORPHAN_AFTER_SECONDS, and its lock is free; removed while holding that lock."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
                or time.time() - st.st_mtime < ORPHAN_AFTER_SECONDS:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def _wait_for_group_exit(group: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)
