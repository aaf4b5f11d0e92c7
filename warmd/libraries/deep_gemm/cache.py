"""DeepGEMM's on-disk JIT cache, in the layout of each generation (install.py).

    nvcc_jit (sgl-deep-gemm 0.1.x):
    <root>/cache/kernel.<kernel name>.<32 hex digest>/   one compiled kernel
        kernel.cu      generated source (template arguments: shape, blocks, SM count...)
        kernel.cubin   what DeepGEMM loads
        kernel.ptx, kernel.sass   only with DG_JIT_DUMP_* set

    deep_jit (DeepGEMM 2.8: vLLM 0.34.0's vendored copy; sgl-deep-gemm 0.2.x: SGLang's):
    <root>/cache/<kernel name>.<hex digest>/
        kernel.cu, kernel.cubin, meta.json (the nvcc command, DeepJIT's config)
        .committed     empty; DeepJIT's own test for a complete entry (written last)
        kernel.ptx, kernel.sass   only with DG_JIT_DUMP_* set

    <root>/tmp/        DeepGEMM's build staging (never an entry)

DeepGEMM builds a kernel in <root>/tmp/<uuid>/ and renames the whole directory into
cache/, so an entry appears complete. An entry's name says its layout (a deep_jit tag has
no dot). nvcc_jit writes no marker: an entry counts as complete when kernel.cu and
kernel.cubin are both regular files, which is also its own test (a directory missing
either aborts the engine with "Corrupted JIT cache directory"); deep_jit's is the marker.
Installs here keep that promise: stage, check, fsync, rename.

The digest does not depend on the cache root: a copied cache hits at any path. nvcc_jit's
hashes the kernel name, the compiler signature (NVCC version), the flags (which carry
``-I<deep_gemm install path>/include`` and the arch) and the source (which carries the SM
count); deep_jit's the nvcc --version output, the flags without include directories and
the source with the contents of the headers it includes (not their path): deep_jit.py
computes it.

DG_JIT_CACHE_DIR: sgl-deep-gemm 0.1.4.post1 takes it as one directory (an "A:B" value is a
directory literally named "A:B"); the deep_jit generation as a lookup list that compiles
into its first directory. The adapter's root is the one directory kernels are compiled into.

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
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.install import install_atomically
from warmd.cache.packing import pack_directory
from warmd.cache.safe_fs import CacheTree
from warmd.libraries.deep_gemm.deep_jit import KEYED_ENV
from warmd.libraries.deep_gemm.install import (
    NVCC_JIT_KEY_ENV,
    Generation,
    generation_of,
    nvrtc_on,
)

LIBRARY = "deep_gemm"
COMMITTED = ".committed"
MAX_SOURCE_BYTES = 4 << 20  # a generated kernel.cu is a few hundred bytes (tests/data)


@dataclass(frozen=True)
class Layout:
    """How one generation names and fills an entry directory."""

    generation: Generation
    name: re.Pattern
    required: tuple[str, ...]  # regular files a complete entry has
    optional: tuple[str, ...]

    def files(self) -> set[str]:
        return {*self.required, *self.optional}


LAYOUTS = (
    Layout(Generation.NVCC_JIT, re.compile(r"^kernel\.([A-Za-z0-9_]+)\.([0-9a-f]{16,64})$"),
           ("kernel.cu", "kernel.cubin"), ("kernel.ptx", "kernel.sass")),
    Layout(Generation.DEEP_JIT, re.compile(r"^([A-Za-z0-9_]+)\.([0-9a-f]{16,64})$"),
           (COMMITTED, "kernel.cu", "kernel.cubin"), ("meta.json", "kernel.ptx", "kernel.sass")),
)


def layout_of(name: str) -> Layout | None:
    """The layout an entry called name has, or None when it is no DeepGEMM entry."""
    return next((layout for layout in LAYOUTS if layout.name.match(name)), None)

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
    """'complete', 'incomplete' or 'invalid' (no DeepGEMM entry name, or not a plain
    directory of regular files)."""
    layout = layout_of(path.name)
    if layout is None or path.is_symlink() or not path.is_dir():
        return "invalid"
    for name in layout.required:
        member = path / name
        if member.is_symlink() or not member.is_file():
            return "incomplete"
    return "complete"


def _required(name: str) -> str:
    layout = layout_of(name)
    return " and ".join(layout.required) if layout else "a DeepGEMM entry name"


class DeepGemmCacheAdapter(CacheAdapter):
    """DeepGEMM's cache under ``root`` (default: DG_JIT_CACHE_DIR as the engine sets it).
    ``arch``/``sms`` describe the GPU for the fingerprint (default: the local one)."""

    library = LIBRARY
    # each fingerprint input: (why DeepGEMM's key depends on it, what to change)
    input_reasons = {
        "version": ("the kernel sources and the key's own scheme", "install the same "
                    "DeepGEMM (the engine's: vLLM's vendored copy, sgl-deep-gemm)"),
        "generation": ("the entry layout (0.1.x nvcc_jit, 2.x deep_jit)",
                       "install the same DeepGEMM version"),
        "install_path": ("0.1.x and unknown versions only: nvcc_jit passes "
                         "-I<package>/include and hashes the flags (measured)",
                         "install deep_gemm at the same path, or use 2.x (path-free key)"),
        "include_digest": ("the headers every kernel includes, by content",
                           "install the same DeepGEMM build"),
        "cuda": ("the nvcc version in every key", "use the same CUDA toolkit version"),
        "env": ("DG_JIT_* variables that change the compiled code",
                "set the same DG_JIT_* variables on both nodes"),
    }
    not_inputs = {"install_path (2.x)": "deep_jit hashes the headers' contents, not their "
                                        "path (measured: a copy elsewhere hits)",
                  "nvcc (path)": "both generations hash nvcc's version output, never its "
                                 "path (nvcc_jit.entry_name, deep_jit.cache_key)",
                  "cache_dir": "DG_JIT_CACHE_DIR is not in the key (a copied cache hits)",
                  "torch": "neither the source nor the flags mention it"}

    def __init__(self, root: Path | None = None, arch: str | None = None,
                 sms: int | None = None) -> None:
        self._root = Path(root) if root is not None else settings.deep_gemm_cache_dir()
        self._arch = arch
        self._sms = sms
        self._sources: dict[Path, KernelSource | None] = {}

    @property
    def root(self) -> Path:
        return self._root

    def for_gpu(self, arch: str, sms: int) -> DeepGemmCacheAdapter:
        """The same cache described as on that GPU (a builder's, building for its target:
        its fingerprint must be a GPU node's)."""
        return DeepGemmCacheAdapter(self._root, arch, sms)

    @property
    def entries_dir(self) -> Path:
        return self._root / "cache"

    # ----- listing -----

    def entry_names(self) -> set[str]:
        """Names of every kernel directory in cache/, complete or not (cheap: one scandir,
        for watching what a GEMM call adds)."""
        try:
            with os.scandir(self.entries_dir) as it:
                return {e.name for e in it if layout_of(e.name)}
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
        if layout_of(name) and entry_state(path) == "complete":
            return CacheEntry(LIBRARY, name, path)
        return None

    def source(self, entry: CacheEntry) -> KernelSource | None:
        """The parsed kernel.cu of an entry (cached: entries never change once complete)."""
        if entry.path not in self._sources:
            try:
                raw = CacheTree(entry.path.parent).read(f"{entry.path.name}/kernel.cu",
                                                        MAX_SOURCE_BYTES).data
            except (OSError, UnsafeArtifact):
                return None
            self._sources[entry.path] = parse_kernel_source(raw.decode(errors="replace"))
        return self._sources[entry.path]

    # ----- pack / install -----

    def pack(self, entry: CacheEntry) -> bytes:
        state = entry_state(entry.path)
        if state != "complete":
            raise IncompleteEntry(f"DeepGEMM entry {entry.path} is {state}: it needs "
                                  f"{_required(entry.name)} as regular files")
        _check_layout(entry.path)
        if entry.path == self.entries_dir / entry.name:  # no link below the configured root
            return pack_directory(self._root, f"cache/{entry.name}")
        return pack_directory(entry.path)

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        if not layout_of(name):
            raise UnsafeArtifact(f"not a DeepGEMM cache entry name: {name!r} (expected "
                                 "kernel.<name>.<hex digest> or <name>.<32 hex digest>)")
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
        """What every kernel's key depends on, as the DeepGEMM this node imports keys it
        (install.py). Always its version and headers: a cluster mixing versions never
        shares entries between them. The install path only where the key holds it:
        nvcc_jit passes -I<package>/include to nvcc and hashes the flags (measured: a cache
        copied to a node where deep_gemm lives elsewhere misses every kernel); deep_jit
        hashes the headers' contents, not their path (measured: an entry compiled through
        one copy hits through vllm.third_party.deep_gemm and through a copy elsewhere; for
        sgl-deep-gemm 0.2.x, whose headers hold the same DeepJIT, deep_jit.py's key shows it
        on the CPU). An unknown version keeps the path: a needless miss, never a wrong hit.
        torch is not in it: neither the source nor the flags mention it."""
        from warmd.libraries import probe_library

        probe = probe_library("deep_gemm")
        nvcc = probe_library("nvcc")
        location = probe.location
        generation = generation_of(probe.version)
        keyed_on_path = location is not None and generation is not Generation.DEEP_JIT
        arch, sms = self._arch, self._sms
        if arch is None or sms is None:
            arch, sms = _local_gpu(arch, sms)
        return {
            "library": LIBRARY,
            "version": probe.version,
            "generation": generation.value if generation else None,
            "install_path": str(Path(location).resolve()) if keyed_on_path else None,
            "include_digest": _include_digest(location) if location else None,
            "cuda": nvcc.version,
            "arch": arch,
            "sms": sms,
            "env": key_env(generation),
        }


def key_env(generation: Generation | None) -> dict[str, str]:
    """The key-changing variables set here, as this generation reads them: deep_jit each
    DG_JIT_X or DJ_JIT_X of KEYED_ENV (it has no NVRTC path); nvcc_jit its DG_ names, with
    DG_JIT_USE_NVRTC only when on (SGLang sets it to "0", the same as unset); an unknown
    generation every name."""
    env = settings.deep_gemm_key_env()
    if generation is Generation.DEEP_JIT:
        return {k: v for k, v in env.items()
                if k[:3] in ("DG_", "DJ_") and k[3:] in KEYED_ENV}
    if generation is Generation.NVCC_JIT:
        return {k: v for k, v in env.items() if k in NVCC_JIT_KEY_ENV
                and (k != "DG_JIT_USE_NVRTC" or nvrtc_on(v))}
    return env


def _check_layout(path: Path) -> None:
    layout = layout_of(path.name)
    if layout is None:
        raise UnsafeArtifact(f"not a DeepGEMM cache entry name: {path.name!r}")
    allowed = layout.files()
    for child in path.iterdir():
        if child.name not in allowed or child.is_symlink() or not child.is_file():
            raise UnsafeArtifact(f"unexpected {child.name!r} in DeepGEMM entry {path.name}: "
                                 f"an entry holds only {', '.join(sorted(allowed))}")


def _check_staged(staged: Path) -> None:
    """Runs on the staged copy (named as the entry) before it becomes visible: only a
    complete, flat entry may be renamed into cache/ (nvcc_jit DeepGEMM aborts on a
    directory missing a file; deep_jit would compile over one without its marker)."""
    _check_layout(staged)
    if entry_state(staged) != "complete":
        raise UnsafeArtifact(f"artifact for {staged.name} is not a complete DeepGEMM entry "
                             f"(needs {_required(staged.name)})")
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
