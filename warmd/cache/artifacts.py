"""Portable cache artifacts: deterministic packing, safe unpacking.

Every cache adapter (DeepGEMM, FlashInfer) ships entries through these helpers:

* ``pack_directory(root, rel)`` -> bytes: a gzip'd tar of ``root/rel``'s contents (names
  relative to it), sorted, with zeroed mtimes/uids/gids and normalized modes, regular files
  and directories only, read as an attacker's filesystem (``safe_fs.CacheTree``: no link
  below ``root``, sizes bounded, each file read once through one descriptor). The same tree
  always gives the same bytes, so digests are stable. ``pack_members`` packs explicit
  members, their content read the same way.
* ``unpack_safely(artifact, dest, max_bytes)``: extracts into an empty directory after
  checking every member first; absolute names, ``..``, links, devices/FIFOs, sparse files,
  duplicate names and archives larger than ``max_bytes`` (compressed, uncompressed, or the
  sum of member sizes) raise ``UnsafeArtifact`` before anything is written. Files are
  created with ``O_EXCL | O_NOFOLLOW`` under ``dest``.

Installing one atomically is ``install.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from warmd import settings
from warmd.cache.base import IncompatibleHere, UnsafeArtifact
from warmd.cache.safe_fs import CacheTree, FileContent

# The largest real FlashInfer module (0.7.4, sm_90a) is fused_moe_90: 248 CUDA sources, so
# an artifact of one object per source, its generated sources and a few build files and
# directories, about 520 members (measured from FlashInfer's own JIT specs: see
# docs/redis.md, "Limits"). A crafted archive of 100,000 members took 159 s to install.
MAX_MEMBERS = 4096
_CHUNK = 1 << 20


def pack_directory(root: Path, rel: str = "", budget: int | None = None) -> bytes:
    """A deterministic gzip'd tar of everything under ``root/rel`` (which is not included),
    read as an attacker's filesystem (warmd.cache.safe_fs): no link followed below ``root``,
    regular files and directories only, at most ``budget`` bytes read in all."""
    tree = CacheTree(root, budget)
    base = f"{rel}/" if rel else ""
    return pack_members([(path, None if is_dir else tree.read(base + path))
                         for path, is_dir in tree.walk(rel)])


Source = FileContent | Path | None


def pack_members(members: list[tuple[str, Source]]) -> bytes:
    """A deterministic gzip'd tar of explicit members: (archive path, content read through a
    CacheTree), or (archive path, None) for a directory. Parent directories are added; order
    is sorted. A Path is read as the regular file it names, trusting its directory as given
    (an adapter reads its cache through its own CacheTree instead, rooted where the
    operator configured it)."""
    entries: dict[str, Source] = {}
    for name, source in members:
        parts = PurePosixPath(name).parts
        for i in range(1, len(parts)):
            entries.setdefault("/".join(parts[:i]), None)
        entries[name] = source
    if len(entries) > MAX_MEMBERS:  # every node would refuse it: never published
        raise UnsafeArtifact(f"refusing to pack {len(entries)} members (the limit is "
                             f"{MAX_MEMBERS})")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(entries):
            _add_member(tar, name, entries[name])
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def _add_member(tar: tarfile.TarFile, name: str, source: Source) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if source is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        return
    if isinstance(source, Path):  # one open, O_NOFOLLOW, read from that descriptor
        source = CacheTree(source.parent).read(source.name)
    info.type = tarfile.REGTYPE
    info.mode = 0o755 if source.executable else 0o644
    info.size = len(source.data)
    tar.addfile(info, io.BytesIO(source.data))


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
