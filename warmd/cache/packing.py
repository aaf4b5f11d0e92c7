"""Packing cache artifacts: the producer's side.

``pack_directory(root, rel)`` -> bytes: a gzip'd tar of ``root/rel``'s contents (names
relative to it), sorted, with zeroed mtimes/uids/gids and normalized modes, regular files
and directories only, read as an attacker's filesystem (``safe_fs.CacheTree``: no link
below ``root``, sizes bounded, each file read once through one descriptor). The same tree
always gives the same bytes, so digests are stable. ``pack_members`` packs explicit
members, their content read the same way. What a node accepts of one (checking, unpacking,
installing) is ``install.py``.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path, PurePosixPath

from warmd.cache.base import UnsafeArtifact
from warmd.cache.install import MAX_MEMBERS
from warmd.cache.safe_fs import CacheTree, FileContent


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
