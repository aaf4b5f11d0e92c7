"""A library's cache directory read as an attacker's filesystem.

Whatever an engine process can write into a watched cache (a planted symlink, a FIFO named
like a Triton group file, a sparse 1 GiB cubin, JSON nested 100,000 deep) must never make
warmd read outside the cache, block, hold more than its limits, or stop a scan. Every read
of a cache for packing or capture goes through ``CacheTree``:

* the root is the directory the operator configured (trusted as given, links included);
  below it every component is opened with ``O_NOFOLLOW`` from its parent's descriptor, so
  no symlink anywhere on the path is followed, and ``.``/``..``/empty components are refused;
* a file is read only when it is a regular file: ``lstat`` first (a FIFO, device or
  socket is refused without being opened), then opened ``O_NONBLOCK`` and ``fstat``'d to
  check it is still the same regular file (no check-then-open race: the bytes come from
  that descriptor);
* sizes are checked from ``st_size`` and ``st_blocks`` before reading (a sparse 1 GiB file
  of 8 KB on disk is refused unread), and reading stops one byte past the limit (a file
  that grows meanwhile is refused, not read whole);
* a tree's reads share one byte budget (an artifact's limit), so many files within the
  per-file limit cannot add up past it;
* JSON goes through the bounded decoder (warmd.boundedjson).

Refusals raise ``UnsafeArtifact`` (the entry must not travel); a file that is missing raises
``FileNotFoundError`` (it may be mid-rename: a later scan looks again).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from warmd import boundedjson, settings
from warmd.cache.base import UnsafeArtifact

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_READ_CHUNK = 1 << 20
_BLOCK_SLACK = 1 << 20  # a file may take more space than its length: blocks, preallocation


@dataclass(frozen=True)
class FileContent:
    """A regular file's bytes as read, and whether it was executable (what packing keeps)."""

    data: bytes
    executable: bool = False


def parts_of(rel: str | PurePosixPath) -> list[str]:
    """The components of a relative path; UnsafeArtifact for anything but plain names."""
    text = str(rel)
    parts = text.split("/") if text else []
    for part in parts:
        if part in ("", ".", "..") or "\x00" in part:
            raise UnsafeArtifact(f"not a plain relative path: {text!r}")
    return parts


def _describe(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


class CacheTree:
    """Reads under ``root`` that follow no link below it and refuse anything but regular
    files and directories. ``budget`` bounds the bytes all reads of this tree return
    together (default: WARMD_MAX_ARTIFACT_BYTES)."""

    def __init__(self, root: Path, budget: int | None = None) -> None:
        self.root = Path(root)
        self.budget = settings.max_artifact_bytes() if budget is None else budget
        self.used = 0

    # ----- descriptors -----

    def _open_dir(self, parts: list[str]) -> int:
        """A descriptor of root/parts (a directory), no link followed below root."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for i, part in enumerate(parts):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                refusal = self._refusal(fd, part, exc, parts[:i + 1], "a directory")
                os.close(fd)
                if refusal is not None:
                    raise refusal from None
                raise
            os.close(fd)
            fd = child
        return fd

    def _refusal(self, dir_fd: int, name: str, exc: OSError, parts: list[str],
                 expected: str) -> UnsafeArtifact | None:
        """What an open that failed with ELOOP/ENOTDIR met, as a refusal (None: another
        error, e.g. missing, which the caller re-raises)."""
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            return None
        try:
            found = _describe(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
        except OSError:
            found = "not readable"
        return UnsafeArtifact(f"{self.root / '/'.join(parts)} is {found}, not {expected}")

    # ----- looking -----

    def lstat(self, rel: str | PurePosixPath) -> os.stat_result:
        """root/rel's own status (a link is reported as one, not followed); links on the way
        to it are refused, a missing path raises FileNotFoundError."""
        parts = parts_of(rel)
        if not parts:
            return os.stat(self.root)
        fd = self._open_dir(parts[:-1])
        try:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)

    def is_file(self, rel: str | PurePosixPath) -> bool:
        """Whether root/rel is a regular file reached without links (never raises)."""
        try:
            return stat.S_ISREG(self.lstat(rel).st_mode)
        except (OSError, UnsafeArtifact):
            return False

    def is_dir(self, rel: str | PurePosixPath) -> bool:
        """Whether root/rel is a directory reached without links (never raises)."""
        try:
            return stat.S_ISDIR(self.lstat(rel).st_mode)
        except (OSError, UnsafeArtifact):
            return False

    def listdir(self, rel: str | PurePosixPath = "") -> list[str]:
        """The names in directory root/rel, sorted."""
        fd = self._open_dir(parts_of(rel))
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def walk(self, rel: str | PurePosixPath = "") -> list[tuple[str, bool]]:
        """(path relative to root/rel, is a directory) of everything under root/rel, parents
        first, sorted; anything but regular files and directories is refused."""
        base = parts_of(rel)
        out: list[tuple[str, bool]] = []

        def visit(parts: list[str]) -> None:
            fd = self._open_dir(base + parts)
            try:
                for name in sorted(os.listdir(fd)):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    path = parts + [name]
                    if stat.S_ISDIR(st.st_mode):
                        out.append(("/".join(path), True))
                        visit(path)
                    elif stat.S_ISREG(st.st_mode):
                        out.append(("/".join(path), False))
                    else:
                        raise UnsafeArtifact(f"{self.root.joinpath(*base, *path)} is "
                                             f"{_describe(st)}, not a regular file or "
                                             "directory")
            finally:
                os.close(fd)

        visit([])
        return out

    # ----- reading -----

    def read(self, rel: str | PurePosixPath, limit: int | None = None) -> FileContent:
        """The bytes of the regular file root/rel, at most ``limit`` (and what is left of
        the tree's budget); refused before reading when its size says it is larger."""
        parts = parts_of(rel)
        if not parts:
            raise UnsafeArtifact(f"{self.root} is a directory, not a file")
        left = self.budget - self.used
        cap = left if limit is None else min(limit, left)
        where = self.root.joinpath(*parts)
        fd = self._open_dir(parts[:-1])
        try:
            before = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            _check_regular(before, where, cap)
            try:
                file_fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
            except OSError as exc:
                refusal = self._refusal(fd, parts[-1], exc, parts, "a regular file")
                if refusal is not None:
                    raise refusal from None
                raise
        finally:
            os.close(fd)
        try:
            st = os.fstat(file_fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
                raise UnsafeArtifact(f"{where} was replaced while it was opened")
            _check_regular(st, where, cap)
            data = _read_at_most(file_fd, cap + 1)
        finally:
            os.close(file_fd)
        if len(data) > cap:
            raise UnsafeArtifact(f"{where} grew past {cap} bytes while it was read")
        self.used += len(data)
        return FileContent(data, bool(st.st_mode & 0o111))

    def read_json(self, rel: str | PurePosixPath, limit: int) -> object:
        """The JSON value of root/rel (``load_json``)."""
        return load_json(self.read(rel, limit).data, limit, str(self.root / str(rel)))


def load_json(raw: bytes, limit: int, where: str) -> object:
    """raw (a file of a cache, where) through the bounded decoder: UnsafeArtifact when out
    of bounds (size, depth, NaN), boundedjson.NotJson (a ValueError) when it does not parse
    at all (what a writer's partial file looks like)."""
    try:
        return boundedjson.loads(raw, limit)
    except boundedjson.NotJson:
        raise
    except boundedjson.JsonRefused as exc:
        raise UnsafeArtifact(f"{where}: {exc}") from None


def _check_regular(st: os.stat_result, where: Path, limit: int) -> None:
    """A regular file that reading may cost: its length, and the space it takes (beyond
    block rounding and preallocation) both within limit."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeArtifact(f"{where} is {_describe(st)}, not a regular file")
    on_disk = st.st_blocks * 512
    if st.st_size > limit or on_disk > limit + _BLOCK_SLACK:
        raise UnsafeArtifact(f"{where} is {st.st_size} bytes ({on_disk} on disk), over the "
                             f"{limit}-byte limit")


def _read_at_most(fd: int, count: int) -> bytes:
    chunks, got = [], 0
    while got < count:
        chunk = os.read(fd, min(_READ_CHUNK, count - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
