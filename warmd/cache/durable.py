"""The filesystem steps that make an install atomic and durable: fsync of a tree and of a
directory, and a rename that never replaces what is at its destination (renameat2's
RENAME_NOREPLACE where the filesystem has it)."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under path (and path itself), children first."""
    for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _load_renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                     ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_renameat2 = _load_renameat2()


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename src to dst unless dst exists; False when dst was there (nothing changed)."""
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                        _RENAME_NOREPLACE)
        if rc == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS):  # filesystem without RENAME_NOREPLACE
            raise OSError(err, os.strerror(err), str(dst))
    # Fallback: rename(2) replaces only an empty directory, never a populated entry.
    if dst.exists() or dst.is_symlink():
        return False
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True
