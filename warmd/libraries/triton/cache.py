"""Triton's on-disk kernel cache (triton 3.x FileCacheManager), made portable.

    $TRITON_CACHE_DIR/<52 base32 chars>/    one compiled kernel: the base32 of the sha256 of
        <name>.source .ttir .ttgir .llir     its cache key (source, signature, constants,
        <name>.ptx .cubin <name>.json        options, triton's own code, env knobs)
        __grp__<name>.json                   the group file: {"child_paths": {file: path}}

Triton writes each file with a temporary name and a rename, the group file last; on a
lookup it reads the group file and treats the kernel as cached only when every path it
lists exists. So an entry is complete when it holds at least one group file and every
file its groups list lies in the entry itself as a regular file. Directories without a
group file (launcher modules, autotune results, a compile in progress) are never entries.

Triton keeps a second kind of entry in the same root: the host-side modules it builds with
the C compiler on a process's first launches (``__triton_launcher<EXT_SUFFIX>`` per kernel
signature, ``cuda_utils<EXT_SUFFIX>`` once), one ``.so`` in a hash directory of its own, no
group file; Triton loads it when the file exists (``runtime/build.py``; measured on the H200:
4 such directories built by a warm process whose kernels were all installed, 0.25 s per
launcher). Its key hashes the C source, the compiler's include and library directories
and the platform; the file name carries the Python ABI. Such an entry is complete when it
holds exactly that one regular file (Triton writes it in a ``tmp.pid_*`` subdirectory and
renames it in place); it holds no path, so it is valid at any root.

The kernels' key does not depend on the cache root, but the group file holds absolute paths
(measured, triton 3.9: an entry copied to another root is a miss there once the original
path is gone, and Triton recompiles it; while the original exists the copy reads the
original's files). So ``pack`` writes the group with bare file names and ``install``
writes this node's absolute paths into it, in the staged copy, before the entry appears;
then the same compile at the new root is a hit (tests/test_triton_cache.py).

This module never imports triton.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sysconfig
import tempfile
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import install_atomically, pack_members
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.probes import dist_version

LIBRARY = "triton"
ENTRY_RE = re.compile(r"^[A-Z2-7]{52}$")  # base32 of a sha256, unpadded
GROUP_RE = re.compile(r"^__grp__.+\.json$")
MODULE_RE = re.compile(r"^[A-Za-z_]\w*\.[\w.-]+\.so$")  # cuda_utils.cpython-312-x86_64-linux-gnu.so
TMP_PREFIX = "tmp.pid_"  # Triton's staging subdirectories (never part of an entry)
MAX_GROUP_BYTES = 1 << 20


def make_adapter(root: Path, target_arch: str) -> TritonCacheAdapter | None:
    """None when Triton is not installed here (nothing would compile into the cache)."""
    if dist_version(("triton",)) is None:
        return None
    return TritonCacheAdapter(root, arch=target_arch)


class IncompleteEntry(ValueError):
    """A Triton directory that is not a complete entry (no group file, a listed file
    missing, a group pointing outside the entry)."""


def read_groups(path: Path) -> dict[str, dict[str, str]]:
    """group file name -> its child_paths (file name -> recorded path); raises
    IncompleteEntry for a directory Triton would not take as a cached kernel."""
    if path.is_symlink() or not path.is_dir():
        raise IncompleteEntry(f"{path} is not a directory")
    groups = {}
    for child in sorted(os.listdir(path)):
        if not GROUP_RE.match(child):
            continue
        member = path / child
        try:
            if member.is_symlink() or member.stat().st_size > MAX_GROUP_BYTES:
                raise ValueError("a link or too large")
            children = json.loads(member.read_bytes())["child_paths"]
            if not isinstance(children, dict):
                raise ValueError("child_paths is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IncompleteEntry(f"group file {member} is not readable: {exc}") from None
        groups[child] = {str(k): str(v) for k, v in children.items()}
    if not groups:
        raise IncompleteEntry(f"{path} has no group file (a compile in progress?)")
    return groups


def _check_present(path: Path, groups: dict[str, dict[str, str]]) -> None:
    """Triton's own test: every listed file exists where its group records it, and that is
    this directory (a group recording another root's paths reads that root, or misses)."""
    for group, children in groups.items():
        for name, recorded in children.items():
            if recorded != str(path / name) or not os.path.exists(recorded):
                raise IncompleteEntry(f"{group} lists {name} at {recorded}, not in {path}")


def _check_safe(path: Path, groups: dict[str, dict[str, str]]) -> None:
    """What may travel: listed files with plain names, regular files, not links."""
    for group, children in groups.items():
        for name in children:
            member = path / name
            if "/" in name or name in ("", ".", "..") or GROUP_RE.match(name):
                raise UnsafeArtifact(f"{group} lists {name!r}: not a file of the entry")
            if member.is_symlink() or not member.is_file():
                raise UnsafeArtifact(f"{group} lists {name}: not a regular file in {path}")


def host_module(path: Path) -> str | None:
    """The file name of a host-module entry (one .so, no group file); None otherwise."""
    try:
        names = [n for n in os.listdir(path) if not n.startswith(TMP_PREFIX)]
    except OSError:
        return None
    if len(names) == 1 and MODULE_RE.match(names[0]):
        return names[0]
    return None


def entry_state(path: Path) -> str:
    """'complete' (Triton takes it as cached), 'incomplete' (Triton would compile it) or
    'unsafe' (complete, but not something warmd ships: links, odd names)."""
    if path.is_dir() and not path.is_symlink() and (module := host_module(path)):
        return "unsafe" if (path / module).is_symlink() or not (path / module).is_file() \
            else "complete"
    try:
        groups = read_groups(path)
        _check_present(path, groups)
    except IncompleteEntry:
        return "incomplete"
    try:
        _check_safe(path, groups)
    except UnsafeArtifact:
        return "unsafe"
    return "complete"


class TritonCacheAdapter(CacheAdapter):
    """Triton's cache under ``root`` (default: TRITON_CACHE_DIR as the engine reads it)."""

    library = LIBRARY

    def __init__(self, root: Path | None = None, arch: str | None = None) -> None:
        self._root = Path(root) if root is not None else settings.triton_cache_dir()
        self.arch = arch

    @property
    def root(self) -> Path:
        return self._root

    def entry_names(self) -> set[str]:
        """Every kernel directory, complete or not (one scandir)."""
        try:
            with os.scandir(self._root) as it:
                return {e.name for e in it if ENTRY_RE.match(e.name)}
        except FileNotFoundError:
            return set()

    def list_entries(self) -> list[CacheEntry]:
        return [CacheEntry(LIBRARY, name, self._root / name)
                for name in sorted(self.entry_names()) if self.is_complete(name)]

    def is_complete(self, name: str) -> bool:
        """Whether Triton takes the entry as cached (pack still refuses an unsafe one)."""
        return bool(ENTRY_RE.match(name)) and entry_state(self._root / name) != "incomplete"

    def pack(self, entry: CacheEntry) -> bytes:
        """The listed files and the group files, with bare names in the groups (the
        archive is the same whichever root it was packed from); or the host module."""
        module = host_module(entry.path)
        if module is not None:
            if entry_state(entry.path) != "complete":
                raise UnsafeArtifact(f"{entry.path / module} is not a regular file")
            return pack_members([(module, entry.path / module)])
        groups = read_groups(entry.path)
        _check_present(entry.path, groups)
        _check_safe(entry.path, groups)
        listed = {name for children in groups.values() for name in children}
        with tempfile.TemporaryDirectory(prefix="warmd-triton-") as tmp:
            members = [(name, entry.path / name) for name in sorted(listed)]
            for group, children in groups.items():
                portable = Path(tmp) / group
                portable.write_text(json.dumps({"child_paths": {k: k for k in children}},
                                               sort_keys=True))
                members.append((group, portable))
            return pack_members(members)

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        if not ENTRY_RE.match(name):
            raise UnsafeArtifact(f"not a Triton cache entry name: {name!r}")
        dest = self._root / name
        if entry_state(dest) == "complete":
            return CacheEntry(LIBRARY, name, dest)
        self._root.mkdir(parents=True, exist_ok=True)
        install_atomically(self._root, name, artifact, prepare=lambda staged: _relocate(
            staged, dest))
        if entry_state(dest) != "complete":  # an incomplete directory was there first
            raise IncompleteEntry(f"an incomplete Triton entry occupies {dest} (Triton "
                                  "recompiles over it)")
        return CacheEntry(LIBRARY, name, dest)

    def fingerprint_inputs(self) -> dict:
        """Triton's key hashes its own sources and libtriton (by content, not path) and the
        kernel; entries are per Triton version and GPU arch. Triton uses the ptxas it ships,
        so the CUDA toolkit is not its input (the common fingerprint still names it)."""
        return {"library": LIBRARY, "version": dist_version(("triton",)), "arch": self.arch,
                "backend": "cuda",
                # host modules: the Python ABI and the platform their key and name carry
                "host": f"{sysconfig.get_config_var('EXT_SUFFIX')}:{platform.machine()}"}


def _relocate(staged: Path, dest: Path) -> None:
    """Check the staged entry holds exactly its groups' files, then record dest's paths
    (a host module: exactly its one regular file)."""
    if host_module(staged) is not None:
        if entry_state(staged) != "complete":
            raise UnsafeArtifact(f"artifact for {dest.name} is not one regular module file")
        return
    try:
        groups = read_groups(staged)
    except IncompleteEntry as exc:  # from the store: neither kind of entry
        raise UnsafeArtifact(f"artifact for {dest.name} is not a Triton entry: {exc}") from None
    _check_safe(staged, groups)
    listed = {name for children in groups.values() for name in children}
    extra = set(os.listdir(staged)) - listed - set(groups)
    if extra:
        raise UnsafeArtifact(f"artifact for {dest.name} holds files no group lists: "
                             f"{sorted(extra)}")
    for group, children in groups.items():
        (staged / group).write_text(json.dumps({"child_paths": {
            k: str(dest / k) for k in children}}))
