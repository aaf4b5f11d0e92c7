"""A cache artifact on the node that receives it: checked, unpacked safely, installed
atomically (packing one is ``packing.py``).

``check_artifact`` and ``unpack_safely(artifact, dest, max_bytes)`` check every member
first: absolute names, ``..``, links, devices/FIFOs, sparse files, duplicate names and
archives larger than ``max_bytes`` (compressed, uncompressed, or the sum of member sizes)
raise ``UnsafeArtifact`` before anything is written. Files are created with
``O_EXCL | O_NOFOLLOW`` under ``dest``.

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
import hashlib
import io
import os
import shutil
import socket
import tarfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from warmd import settings
from warmd.cache.base import IncompatibleHere, UnsafeArtifact
from warmd.cache.durable import fsync_dir, fsync_tree, rename_noreplace
from warmd.processes import pid_alive

# The largest real FlashInfer module (0.7.4, sm_90a) is fused_moe_90: 248 CUDA sources, so
# an artifact of one object per source, its generated sources and a few build files and
# directories, about 520 members (measured from FlashInfer's own JIT specs: see
# docs/redis.md, "Limits"). A crafted archive of 100,000 members took 159 s to install.
MAX_MEMBERS = 4096
_CHUNK = 1 << 20


class TooLargeHere(IncompatibleHere):
    """An artifact that unpacks to more than this node's limit (WARMD_MAX_ARTIFACT_BYTES): a
    node with a larger limit may use it, so it is a miss here, never a reason to remove it."""


def _gunzip_limited(artifact: bytes, limit: int) -> bytes:
    """Decompress, refusing output larger than limit (a compression bomb stops early)."""
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    data = artifact
    try:
        while data:
            out += decomp.decompress(data, max(1, limit + 1 - len(out)))
            if len(out) > limit:
                raise TooLargeHere(f"artifact unpacks to more than {limit} bytes")
            data = decomp.unconsumed_tail
        if not decomp.eof:
            raise UnsafeArtifact("artifact is truncated (incomplete gzip stream)")
    except zlib.error as exc:
        raise UnsafeArtifact(f"artifact is not a gzip'd tar: {exc}") from None
    return bytes(out)


def _check_member(member: tarfile.TarInfo, seen: set[str]) -> str:
    name = member.name
    if not name or "\x00" in name or "\\" in name:
        raise UnsafeArtifact(f"bad member name {name!r}")
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise UnsafeArtifact(f"absolute path in artifact: {name!r}")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts or ".." in parts:
        raise UnsafeArtifact(f"path escapes the entry: {name!r}")
    if member.issym() or member.islnk():
        raise UnsafeArtifact(f"link in artifact: {name!r} -> {member.linkname!r}")
    if _is_sparse(member):
        # isreg() is true for sparse members, and extraction writes their declared size,
        # not the bytes the archive holds: a few bytes could fill a disk.
        raise UnsafeArtifact(f"sparse file in artifact: {name!r}")
    if not (member.isreg() or member.isdir()):
        raise UnsafeArtifact(f"special file (device, FIFO...) in artifact: {name!r}")
    clean = "/".join(parts)
    if clean in seen:
        raise UnsafeArtifact(f"duplicate member in artifact: {name!r}")
    seen.add(clean)
    return clean


def _is_sparse(member: tarfile.TarInfo) -> bool:
    return (member.issparse() or member.type == tarfile.GNUTYPE_SPARSE
            or any(key.startswith("GNU.sparse.") for key in member.pax_headers))


def check_artifact(artifact: bytes, max_bytes: int | None = None) -> list[tuple[str, bool]]:
    """Validate an artifact without writing anything; returns its (path, is_dir) members."""
    return _checked(artifact, max_bytes)[1]


def _checked(artifact: bytes, max_bytes: int | None) -> tuple[bytes, list[tuple[str, bool]]]:
    """The artifact's tar, decompressed once, and its checked (path, is_dir) members."""
    limit = settings.max_artifact_bytes() if max_bytes is None else max_bytes
    if len(artifact) > limit:
        raise UnsafeArtifact(f"artifact is {len(artifact)} bytes, over the {limit}-byte limit")
    raw = _gunzip_limited(artifact, limit)
    members = []
    seen: set[str] = set()
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                if len(members) >= MAX_MEMBERS:
                    raise UnsafeArtifact(f"artifact holds more than {MAX_MEMBERS} members")
                members.append((_check_member(member, seen), member.isdir()))
                total += max(member.size, 0)
                if total > limit:
                    raise UnsafeArtifact(f"artifact members add up to more than the "
                                         f"{limit}-byte limit")
    except tarfile.TarError as exc:
        raise UnsafeArtifact(f"artifact is not a valid tar: {exc}") from None
    files = {m for m, is_dir in members if not is_dir}
    for path, _ in members:
        parents = PurePosixPath(path).parents
        if any(str(p) in files for p in parents if str(p) != "."):
            raise UnsafeArtifact(f"member {path!r} lies under a file of the same artifact")
    return raw, members


def unpack_safely(artifact: bytes, dest: Path, max_bytes: int | None = None) -> None:
    """Extract a checked artifact into the empty (or new) directory ``dest``; raises
    UnsafeArtifact before writing anything when any member is unsafe."""
    unpack_written(artifact, Path(dest), max_bytes)


def unpack_written(artifact: bytes, dest: Path, max_bytes: int | None) -> Written:
    """unpack_safely, saying what it wrote (for installed_digest)."""
    raw, _members = _checked(artifact, max_bytes)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"unpack destination is not empty: {dest}")
    written = Written(raw)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar:
            parts = [p for p in PurePosixPath(member.name).parts if p != "."]
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(mode=0o755, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None  # a regular member always has a file object
            mode = 0o755 if member.mode & 0o111 else 0o644
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            written.files["/".join(parts)] = (member.offset_data, member.size)
    return written


@dataclass
class Written:
    """The regular files an unpack wrote: relative path -> where their bytes lie in the
    decompressed tar."""

    tar: bytes
    files: dict[str, tuple[int, int]] = field(default_factory=dict)

    def digest(self) -> str:
        """records.entry_digest of the tree these files make (relative path and bytes, in
        path order), from the bytes just written, without reading them back."""
        digest = hashlib.sha256()
        view = memoryview(self.tar)
        for rel in sorted(self.files, key=lambda r: PurePosixPath(r).parts):
            offset, size = self.files[rel]
            digest.update(rel.encode() + b"\0")
            digest.update(view[offset:offset + size])
        return digest.hexdigest()


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
