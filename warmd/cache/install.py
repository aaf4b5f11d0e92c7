"""Installing a cache artifact atomically.

``install_atomically(root, name, artifact, ...)`` unpacks into a staging directory under
``root/.warmd-staging`` (same filesystem), lets the adapter adjust the staged tree
(``prepare``), fsyncs files and directories, then renames the entry into ``root/name``
without replacing anything that appeared meanwhile (a concurrent installer or the library
itself won: ours is discarded). A reader sees either no entry or a complete one; a process
killed mid-install leaves only a staging directory, which ``clean_staging`` removes later.
Inside ``install_batch()`` the cache root's fsync (the rename's durability) is done once per
root when the batch ends instead of once per entry.

An artifact is decompressed and checked once per install; the digest of the files it wrote
(``records.entry_digest``) is computed while writing them and kept (``installed_digest``)
as long as none of them changed since, so a task record right after an install hashes
nothing again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from warmd.cache.artifacts import Written, unpack_written
from warmd.cache.base import UnsafeArtifact
from warmd.cache.durable import fsync_dir, fsync_tree, rename_noreplace
from warmd.processes import pid_alive

STAGING_DIR = ".warmd-staging"
# A staging directory whose owner we cannot check (other host) is stale after this long.
STALE_STAGING_SECONDS = 3600.0

# path of an installed entry -> (entry digest, the stat of each file when it was written)
_INSTALLED: dict[str, tuple[str, dict[str, tuple[int, int, int, int]]]] = {}
_INSTALLED_MAX = 20_000
_INSTALLED_LOCK = threading.Lock()


def _file_stats(root: Path, rels: Iterator[str] | list[str]
                ) -> dict[str, tuple[int, int, int, int]] | None:
    out = {}
    try:
        for rel in rels:
            st = os.lstat(root / rel)
            out[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return None
    return out


def _remember_digest(path: Path, staged: Path, written: Written) -> None:
    stats = _file_stats(staged, list(written.files))
    if stats is None:
        return
    with _INSTALLED_LOCK:
        if len(_INSTALLED) >= _INSTALLED_MAX:
            _INSTALLED.clear()
        _INSTALLED[str(path)] = (written.digest(), stats)


def installed_digest(path: Path) -> str | None:
    """The entry digest of an entry this process installed at path, when its files are still
    exactly the ones it wrote (same inode, size, mtime and ctime each: any write, even one
    that restores the mtime, changes the ctime, and no file was added); None otherwise."""
    with _INSTALLED_LOCK:
        known = _INSTALLED.get(str(path))
    if known is None:
        return None
    digest, stats = known
    try:
        now = {p.relative_to(path).as_posix() for p in path.rglob("*")
               if not p.is_dir() or p.is_symlink()}
    except OSError:
        return None
    if now != set(stats) or _file_stats(path, list(stats)) != stats:
        return None
    return digest


@dataclass(frozen=True)
class Installed:
    path: Path
    installed: bool  # False: the entry was already there (another installer or the library)


def _check_entry_name(name: str) -> None:
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name
            or name.startswith(".")):
        raise UnsafeArtifact(f"bad cache entry name {name!r}")


def _staging_prefix() -> str:
    return f"{socket.gethostname()}+{os.getpid()}+"


@dataclass
class _Batch:
    roots: set[Path] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_BATCH: ContextVar[_Batch | None] = ContextVar("warmd_install_batch", default=None)


@contextlib.contextmanager
def install_batch() -> Iterator[None]:
    """Installs inside the block (and in contexts copied from it: worker threads) fsync
    their cache roots once, when the block ends, instead of once per entry. Each entry's
    own files are still fsynced before it is renamed into place, so an entry a crash leaves
    visible is complete; a rename a crash loses leaves the entry absent: fetched again."""
    batch = _Batch()
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
        for root in sorted(batch.roots):
            with contextlib.suppress(OSError):
                fsync_dir(root)


def _root_synced(root: Path) -> None:
    """The rename into root made durable: now, or when the install batch ends."""
    batch = _BATCH.get()
    if batch is None:
        fsync_dir(root)
        return
    with batch.lock:
        batch.roots.add(root)


@contextlib.contextmanager
def staging(root: Path) -> Iterator[Path]:
    """A fresh directory under ``root/.warmd-staging`` (same filesystem as root, so a rename
    into root is atomic), removed afterwards whatever happens. Stale ones from killed
    processes are cleaned first."""
    staging_root = Path(root) / STAGING_DIR
    staging_root.mkdir(parents=True, exist_ok=True)
    clean_staging(root)
    stage = staging_root / f"{_staging_prefix()}{uuid.uuid4().hex[:12]}"
    stage.mkdir()
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def install_atomically(root: Path, name: str, artifact: bytes, *,
                       max_bytes: int | None = None,
                       prepare: Callable[[Path], None] | None = None) -> Installed:
    """Install ``artifact`` as the directory ``root/name``, all or nothing.

    ``prepare(staged_dir)`` may rewrite the staged tree (paths, mtimes) before it becomes
    visible. An existing ``root/name`` is never replaced: it is kept and ours discarded.
    """
    _check_entry_name(name)
    root = Path(root)
    dest = root / name
    if dest.exists():
        return Installed(dest, False)
    with staging(root) as stage:
        staged = stage / name
        written = unpack_written(artifact, staged, max_bytes)
        if prepare is not None:
            prepare(staged)
        fsync_tree(staged)
        _remember_digest(dest, staged, written)
        moved = rename_noreplace(staged, dest)
        if moved:
            _root_synced(root)
        return Installed(dest, moved)


def clean_staging(root: Path, max_age: float = STALE_STAGING_SECONDS) -> list[Path]:
    """Remove staging directories left by killed installers: ours (same host) whose process
    is gone, and any older than max_age. Returns what was removed."""
    staging_root = Path(root) / STAGING_DIR
    removed = []
    try:
        entries = list(os.scandir(staging_root))
    except FileNotFoundError:
        return removed
    host = socket.gethostname()
    now = time.time()
    for entry in entries:
        owner_host, _, rest = entry.name.partition("+")
        pid_text = rest.split("+", 1)[0]
        stale = False
        if owner_host == host and pid_text.isdigit() and int(pid_text) != os.getpid():
            stale = not pid_alive(int(pid_text))
        try:
            stale = stale or now - entry.stat(follow_symlinks=False).st_mtime > max_age
        except FileNotFoundError:
            continue
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed
