"""DeepGEMM's on-disk JIT cache, as sgl-deep-gemm 0.1.4.post1 lays it out.

    <root>/cache/kernel.<kernel name>.<32 hex digest>/   one compiled kernel
        kernel.cu      generated source (template arguments: shape, blocks, SM count...)
        kernel.cubin   what DeepGEMM loads
        kernel.ptx, kernel.sass   only with DG_JIT_DUMP_* set
    <root>/tmp/        DeepGEMM's build staging (never an entry)

DeepGEMM builds a kernel in <root>/tmp/<uuid>/ and renames the whole directory into
cache/, so an entry appears complete. It writes no completion marker: an entry counts as
complete when kernel.cu and kernel.cubin are both regular files, which is also DeepGEMM's
own test (a directory missing either aborts the engine with "Corrupted JIT cache
directory"). Installs here keep that promise: stage, check, fsync, rename.

The digest hashes the kernel name, the compiler signature (NVCC/NVRTC version), the flags
(which carry ``-I<deep_gemm install path>/include`` and the arch) and the source (which
carries the SM count). Not the cache root: a copied cache hits at any path.

DG_JIT_CACHE_DIR is one directory: 0.1.4.post1 has no read-only lookup roots (an "A:B"
value is a directory literally named "A:B"), so neither has this adapter.

This module never imports torch or deep_gemm.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import install_atomically, pack_directory
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact

LIBRARY = "deep_gemm"
ENTRY_RE = re.compile(r"^kernel\.([A-Za-z0-9_]+)\.([0-9a-f]{16,64})$")
REQUIRED_FILES = ("kernel.cu", "kernel.cubin")
OPTIONAL_FILES = ("kernel.ptx", "kernel.sass")
# The one template instantiation a generated kernel.cu holds: &<kernel><args>);
_IMPL_RE = re.compile(r"&\s*([A-Za-z_][A-Za-z0-9_:]*)\s*<(.*)>\s*\)\s*;", re.S)


def make_adapter(root: Path, target_arch: str) -> DeepGemmCacheAdapter:
    """The warmup's view of DeepGEMM's cache under root (the fingerprint describes the local
    GPU: DeepGEMM kernels are built where they run)."""
    return DeepGemmCacheAdapter(root)


class IncompleteEntry(ValueError):
    """A cache directory DeepGEMM would reject (kernel.cu or kernel.cubin missing)."""


@dataclass(frozen=True)
class KernelSource:
    """What a kernel.cu says about the kernel: its impl and template arguments."""

    impl: str
    args: tuple[str, ...]

    @property
    def gemm_type(self) -> str | None:
        for arg in self.args:
            if arg.startswith("GemmType::"):
                return arg.removeprefix("GemmType::")
        return None


def parse_kernel_source(text: str) -> KernelSource | None:
    """The impl name and template arguments of a generated kernel.cu, or None."""
    match = _IMPL_RE.search(text)
    if match is None:
        return None
    return KernelSource(match.group(1), tuple(_split_args(match.group(2))))


def _split_args(text: str) -> list[str]:
    args, depth, current = [], 0, []
    for char in text:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        args.append("".join(current).strip())
    return args


def entry_state(path: Path) -> str:
    """'complete', 'incomplete' or 'invalid' (not a plain directory of regular files)."""
    if path.is_symlink() or not path.is_dir():
        return "invalid"
    for name in REQUIRED_FILES:
        member = path / name
        if member.is_symlink() or not member.is_file():
            return "incomplete"
    return "complete"


class DeepGemmCacheAdapter(CacheAdapter):
    """DeepGEMM's cache under ``root`` (default: DG_JIT_CACHE_DIR as the engine sets it).
    ``arch``/``sms`` describe the GPU for the fingerprint (default: the local one)."""

    library = LIBRARY

    def __init__(self, root: Path | None = None, arch: str | None = None,
                 sms: int | None = None) -> None:
        self._root = Path(root) if root is not None else settings.deep_gemm_cache_dir()
        self._arch = arch
        self._sms = sms
        self._sources: dict[Path, KernelSource | None] = {}

    @property
    def root(self) -> Path:
        return self._root

    @property
    def entries_dir(self) -> Path:
        return self._root / "cache"

    # ----- listing -----

    def entry_names(self) -> set[str]:
        """Names of every kernel directory in cache/, complete or not (cheap: one scandir,
        for watching what a GEMM call adds)."""
        try:
            with os.scandir(self.entries_dir) as it:
                return {e.name for e in it if ENTRY_RE.match(e.name)}
        except FileNotFoundError:
            return set()

    def list_entries(self) -> list[CacheEntry]:
        """Complete entries, sorted by name (DeepGEMM's tmp/ and warmd's staging never)."""
        return [CacheEntry(LIBRARY, name, self.entries_dir / name)
                for name in sorted(self.entry_names())
                if entry_state(self.entries_dir / name) == "complete"]

    def find(self, name: str) -> CacheEntry | None:
        """The complete entry called name, if there is one."""
        path = self.entries_dir / name
        if ENTRY_RE.match(name) and entry_state(path) == "complete":
            return CacheEntry(LIBRARY, name, path)
        return None

    def source(self, entry: CacheEntry) -> KernelSource | None:
        """The parsed kernel.cu of an entry (cached: entries never change once complete)."""
        if entry.path not in self._sources:
            try:
                text = (entry.path / "kernel.cu").read_text(errors="replace")
            except OSError:
                return None
            self._sources[entry.path] = parse_kernel_source(text)
        return self._sources[entry.path]

    # ----- pack / install -----

    def pack(self, entry: CacheEntry) -> bytes:
        state = entry_state(entry.path)
        if state != "complete":
            raise IncompleteEntry(f"DeepGEMM entry {entry.path} is {state}: it needs "
                                  f"{' and '.join(REQUIRED_FILES)} as regular files")
        _check_layout(entry.path)
        return pack_directory(entry.path)

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        if not ENTRY_RE.match(name):
            raise UnsafeArtifact(f"not a DeepGEMM cache entry name: {name!r} "
                                 "(expected kernel.<name>.<hex digest>)")
        existing = self.find(name)
        if existing is not None:
            return existing
        self.entries_dir.mkdir(parents=True, exist_ok=True)
        installed = install_atomically(self.entries_dir, name, artifact,
                                       prepare=_check_staged)
        state = entry_state(installed.path)
        if state != "complete":  # a damaged directory was there first; it is not replaced
            raise IncompleteEntry(f"an {state} DeepGEMM entry occupies {installed.path} "
                                  "(DeepGEMM aborts on it: remove it)")
        return CacheEntry(LIBRARY, name, installed.path)

    # ----- compatibility -----

    def fingerprint_inputs(self) -> dict:
        """What every kernel's key depends on. The install path is in it because DeepGEMM
        passes -I<package>/include to the compiler and hashes the flags (measured: a cache
        copied to a node where deep_gemm lives elsewhere misses every kernel). torch is not:
        neither the source nor the flags mention it."""
        from warmd.libraries import probe_library

        probe = probe_library("deep_gemm")
        nvcc = probe_library("nvcc")
        location = probe.location
        arch, sms = self._arch, self._sms
        if arch is None or sms is None:
            arch, sms = _local_gpu(arch, sms)
        return {
            "library": LIBRARY,
            "version": probe.version,
            "install_path": str(Path(location).resolve()) if location else None,
            "include_digest": _include_digest(location) if location else None,
            "cuda": nvcc.version,
            "nvcc": nvcc.location,
            "arch": arch,
            "sms": sms,
            "env": settings.deep_gemm_key_env(),
        }


def _check_layout(path: Path) -> None:
    allowed = set(REQUIRED_FILES) | set(OPTIONAL_FILES)
    for child in path.iterdir():
        if child.name not in allowed or child.is_symlink() or not child.is_file():
            raise UnsafeArtifact(f"unexpected {child.name!r} in DeepGEMM entry {path.name}: "
                                 f"an entry holds only {', '.join(sorted(allowed))}")


def _check_staged(staged: Path) -> None:
    """Runs on the staged copy before it becomes visible: only a complete, flat entry may
    be renamed into cache/ (DeepGEMM aborts on a directory missing either file)."""
    _check_layout(staged)
    if entry_state(staged) != "complete":
        raise UnsafeArtifact(f"artifact for {staged.name} is not a complete DeepGEMM entry "
                             f"(needs {' and '.join(REQUIRED_FILES)})")
    if (staged / "kernel.cubin").stat().st_size == 0:
        raise UnsafeArtifact(f"artifact for {staged.name} has an empty kernel.cubin")


@cache
def _include_digest(location: str) -> str | None:
    """sha256 over deep_gemm's headers (path and bytes), which every kernel.cu includes."""
    include = Path(location) / "include"
    if not include.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in include.rglob("*") if p.is_file()):
        digest.update(path.relative_to(include).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _local_gpu(arch: str | None, sms: int | None) -> tuple[str | None, int | None]:
    from warmd.targets import detect_local_gpus

    gpus = detect_local_gpus()
    if not gpus:
        return arch, sms
    return arch or gpus[0].arch, sms if sms is not None else gpus[0].sms
