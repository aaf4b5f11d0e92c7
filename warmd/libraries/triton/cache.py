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
then the same compile at the new root is a hit (tests/libraries/test_triton_cache.py).

This module never imports triton.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sysconfig
from pathlib import Path

from warmd import settings
from warmd.boundedjson import NotJson
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.install import install_atomically
from warmd.cache.packing import pack_members
from warmd.cache.safe_fs import CacheTree, FileContent, load_json
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


def read_groups(tree: CacheTree, name: str) -> dict[str, dict[str, str]]:
    """group file name -> its child_paths (file name -> recorded path) of the entry
    tree.root/name; raises IncompleteEntry for a directory Triton would not take as a cached
    kernel, UnsafeArtifact for group files that are not bounded JSON in regular files (a
    link, a FIFO: never opened blocking)."""
    groups = {}
    for child in tree.listdir(name):
        if not GROUP_RE.match(child):
            continue
        try:
            data = tree.read_json(f"{name}/{child}", MAX_GROUP_BYTES)
        except (FileNotFoundError, NotJson) as exc:
            raise IncompleteEntry(f"group file {tree.root / name / child} is not readable: "
                                  f"{exc}") from None
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            raise IncompleteEntry(f"group file {tree.root / name / child} has no child_paths")
        groups[child] = {str(k): str(v) for k, v in children.items()}
    if not groups:
        raise IncompleteEntry(f"{tree.root / name} has no group file (a compile in progress?)")
    return groups


def _check_present(tree: CacheTree, name: str, groups: dict[str, dict[str, str]]) -> None:
    """Triton's own test: every listed file exists where its group records it, and that is
    this directory (a group recording another root's paths reads that root, or misses)."""
    path = tree.root / name
    for group, children in groups.items():
        for child, recorded in children.items():
            if recorded != str(path / child) or not _exists(tree, f"{name}/{child}"):
                raise IncompleteEntry(f"{group} lists {child} at {recorded}, not in {path}")


def _exists(tree: CacheTree, rel: str) -> bool:
    try:
        tree.lstat(rel)
    except FileNotFoundError:
        return False
    return True


def _check_safe(tree: CacheTree, name: str, groups: dict[str, dict[str, str]]) -> None:
    """What may travel: listed files with plain names, regular files, not links."""
    for group, children in groups.items():
        for child in children:
            if "/" in child or child in ("", ".", "..") or GROUP_RE.match(child):
                raise UnsafeArtifact(f"{group} lists {child!r}: not a file of the entry")
            if not tree.is_file(f"{name}/{child}"):
                raise UnsafeArtifact(f"{group} lists {child}: not a regular file in "
                                     f"{tree.root / name}")


def _read_listed(tree: CacheTree, name: str, child: str) -> FileContent:
    """A listed file's bytes; Triton's metadata (<kernel>.json) must be bounded JSON."""
    content = tree.read(f"{name}/{child}")
    if child.endswith(".json"):
        try:
            load_json(content.data, MAX_GROUP_BYTES, str(tree.root / name / child))
        except NotJson as exc:
            raise UnsafeArtifact(f"{tree.root / name / child}: {exc}") from None
    return content


def host_module(tree: CacheTree, name: str) -> str | None:
    """The file name of a host-module entry (one .so, no group file); None otherwise."""
    try:
        names = [n for n in tree.listdir(name) if not n.startswith(TMP_PREFIX)]
    except (OSError, UnsafeArtifact):
        return None
    if len(names) == 1 and MODULE_RE.match(names[0]):
        return names[0]
    return None


def entry_state(path: Path) -> str:
    """'complete' (Triton takes it as cached), 'incomplete' (Triton would compile it) or
    'unsafe' (there, but not something warmd ships: links, FIFOs, odd names, JSON out of
    bounds). Never blocks, never raises."""
    return _state(CacheTree(path.parent), path.name)


def _state(tree: CacheTree, name: str) -> str:
    try:
        if not tree.is_dir(name):
            tree.lstat(name)  # there, but a link or not a directory
            return "unsafe"
        module = host_module(tree, name)
        if module is not None:
            return "complete" if tree.is_file(f"{name}/{module}") else "unsafe"
        groups = read_groups(tree, name)
        _check_present(tree, name, groups)
        _check_safe(tree, name, groups)
    except (OSError, IncompleteEntry):
        return "incomplete"
    except UnsafeArtifact:
        return "unsafe"
    return "complete"


class TritonCacheAdapter(CacheAdapter):
    """Triton's cache under ``root`` (default: TRITON_CACHE_DIR as the engine reads it)."""

    library = LIBRARY
    # each fingerprint input: (why Triton's key depends on it, what to change)
    input_reasons = {
        "version": ("Triton's key hashes its own sources and libtriton",
                    "install the same triton version"),
        "backend": ("entries are per backend", "-"),
        "host": ("host modules carry the Python ABI and platform in their key and name",
                 "use the same Python minor version and platform"),
    }
    not_inputs = {"install_path": "Triton hashes its sources by content, not path",
                  "cuda_toolkit (own key)": "Triton uses the ptxas it ships"}

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
        archive is the same whichever root it was packed from); or the host module. Read
        as an attacker's filesystem (warmd.cache.safe_fs)."""
        name = entry.name
        if not ENTRY_RE.match(name):
            raise UnsafeArtifact(f"not a Triton cache entry name: {name!r}")
        tree = CacheTree(self._root)
        module = host_module(tree, name)
        if module is not None:
            return pack_members([(module, tree.read(f"{name}/{module}"))])
        groups = read_groups(tree, name)
        _check_present(tree, name, groups)
        _check_safe(tree, name, groups)
        listed = sorted({child for children in groups.values() for child in children})
        members: list[tuple[str, FileContent | None]] = [
            (child, _read_listed(tree, name, child)) for child in listed]
        for group, children in groups.items():
            portable = json.dumps({"child_paths": {k: k for k in children}}, sort_keys=True)
            members.append((group, FileContent(portable.encode())))
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
    tree = CacheTree(staged.parent)
    if host_module(tree, staged.name) is not None:
        if _state(tree, staged.name) != "complete":
            raise UnsafeArtifact(f"artifact for {dest.name} is not one regular module file")
        return
    try:
        groups = read_groups(tree, staged.name)
    except IncompleteEntry as exc:  # from the store: neither kind of entry
        raise UnsafeArtifact(f"artifact for {dest.name} is not a Triton entry: {exc}") from None
    _check_safe(tree, staged.name, groups)
    listed = {name for children in groups.values() for name in children}
    extra = set(os.listdir(staged)) - listed - set(groups)
    if extra:
        raise UnsafeArtifact(f"artifact for {dest.name} holds files no group lists: "
                             f"{sorted(extra)}")
    for name in sorted(listed):
        _read_listed(tree, staged.name, name)  # metadata JSON within bounds
    for group, children in groups.items():
        (staged / group).write_text(json.dumps({"child_paths": {
            k: str(dest / k) for k in children}}))
