"""DeepJIT, the JIT of the ``deep_jit`` generation (install.py: DeepGEMM 2.8.x, vendored in
vLLM 0.34.0, and sgl-deep-gemm 0.2.x, pinned by SGLang 0.5.23): a kernel's cache key, its
entry name and the nvcc command it runs, computed as its C++ does, without a GPU.

Read in sgl-deep-gemm 0.2.3.post2's wheel, which ships DeepJIT's headers
(``deep_gemm/include/deep_jit``) and DeepGEMM's configuration of it (the strings of its
``_C.so``, ``csrc/runtime/jit.hpp`` upstream):

- ``runtime/runtime.hpp`` ``Runtime::cache_key``: one ``hash::FNV1a`` updated with the
  extra signature (DeepGEMM: ``"cutlass-" + CUTLASS_VERSION``), the digest of the whole
  ``<nvcc> --version`` output, the compiler flags joined by spaces (``get_flags``: the
  include directories are not among them), the post-hook digest (``""``: DeepGEMM sets no
  hook) and the digest of the source with, in place of each ``#include <deep_gemm/...>``,
  the digest of that header's text, recursively (``utils/parser.hpp``). Where the package
  lives is in none of them: a cache copied to another install path, or another copy of the
  same release, hits.
- ``cache/disk.hpp``: the entry is ``<first root>/cache/<tag>.<key>/``, built in
  ``<first root>/tmp/<uuid>/`` and renamed whole once ``.committed`` is written;
  ``DG_JIT_CACHE_DIR`` (else ``DJ_JIT_CACHE_DIR``, else ``$HOME/.dj``) is a ``:`` list whose
  later roots are only read.
- ``backend/cuda/backend.hpp``: ``cd <build dir> && <nvcc> <dir>/kernel.cu --cubin
  --output-file <dir>/kernel.cubin <flags> --include-path <package>/include``; the nvcc is
  ``DG_JIT_NVCC_COMPILER`` (else ``DJ_``), else ``$CUDA_HOME/bin/nvcc``.
- ``backend/cuda/options.hpp``: the flags, and the variables that change them; every
  ``DG_X`` variable falls back to ``DJ_X`` (``utils/env.hpp``).

A kernel's own overrides of the options (none for DeepGEMM's GEMMs in the sources read)
would change its flags: ``cache_key`` takes the flags as given, ``default_flags`` are
DeepGEMM's defaults. This module imports nothing of DeepGEMM, torch or CUDA.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE

_MASK = (1 << 64) - 1
_SEEDS = (0xc6a4a7935bd1e995, 0xff51afd7ed558ccd)
_PRIMES = (0x100000001b3, 0x9e3779b97f4a7c15)
PREFIX, FALLBACK_PREFIX = "DG", "DJ"  # DeepGEMM's env prefix; DeepJIT's global one
INCLUDE_PREFIXES = ("deep_gemm/",)  # the includes whose text is in the key
# Variables that change DeepJIT's flags (options.hpp default_options), hence every key (each
# DG_X or DJ_X; knobs.DEEP_GEMM_KEY_ENV puts them in the fingerprint).
FLAG_ENV = ("JIT_DEBUG", "JIT_PTXAS_VERBOSE", "JIT_CHECK_NO_SPILLS", "JIT_CHECK_NO_LOCAL_MEMORY",
            "JIT_WITH_LINEINFO", "JIT_CPP_STANDARD")
# ... and the compiler, whose `--version` output is hashed.
KEYED_ENV = (*FLAG_ENV, "JIT_NVCC_COMPILER")


class Fnv1a:
    """DeepJIT's ``hash::FNV1a``: two 64-bit FNV-1a states (different primes), each update
    prefixed with its length as 8 little-endian bytes, finished by SplitMix64."""

    def __init__(self) -> None:
        self.states = list(_SEEDS)

    def update(self, data: str | bytes) -> Fnv1a:
        raw = data.encode() if isinstance(data, str) else data
        a, b = self.states
        for byte in len(raw).to_bytes(8, "little") + raw:
            a = ((a ^ byte) * _PRIMES[0]) & _MASK
            b = ((b ^ byte) * _PRIMES[1]) & _MASK
        self.states = [a, b]
        return self

    def hexdigest(self) -> str:
        return "".join(f"{split_mix(s):016x}" for s in self.states)


def split_mix(value: int) -> int:
    value = ((value ^ (value >> 30)) * 0xbf58476d1ce4e5b9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94d049bb133111eb) & _MASK
    return value ^ (value >> 31)


def hex_digest(data: str | bytes) -> str:
    return Fnv1a().update(data).hexdigest()


class NonStandardInclude(ValueError):
    """An include DeepJIT refuses (it panics: 'non-standard include')."""


_INCLUDE = re.compile(r"^[ \t\f\v]*#[ \t\f\v]*include[ \t\f\v]*([<\"].*)$")


def _included(line: str, prefixes: tuple[str, ...]) -> str | None:
    """Parser::parse_include: the header a line includes when its name has one of the
    prefixes; NonStandardInclude for a quoted or malformed include."""
    match = _INCLUDE.match(line)
    if match is None:
        return None
    rest = match.group(1)
    closing = next((i for i in range(1, len(rest)) if rest[i] in '>"'), None)
    if closing is None:
        return None
    name = rest[1:closing]
    if (rest[0] != "<" or rest[closing] != ">" or not name or name[0] in " \t\f\v"
            or name[-1] in " \t\f\v"):
        raise NonStandardInclude(f"non-standard include: {rest[:closing + 1]}")
    return name if name.startswith(prefixes) else None


@dataclass
class SourceHasher:
    """DeepJIT's ``Parser``: a source's digest over its text and, in order, the digests of
    the headers it includes under the prefixes, found in the include directories."""

    include_dirs: tuple[Path, ...]
    prefixes: tuple[str, ...] = INCLUDE_PREFIXES
    _done: dict[str, str] = field(default_factory=dict)
    _visiting: set[str] = field(default_factory=set)

    def digest(self, code: str | bytes) -> str:
        raw = code.encode() if isinstance(code, str) else code
        hasher = Fnv1a().update(raw)
        for line in raw.decode(errors="surrogateescape").split("\n"):
            name = _included(line, self.prefixes)
            if name is not None:
                hasher.update(self._header(name))
        return hasher.hexdigest()

    def _header(self, name: str) -> str:
        if name in self._done:
            return self._done[name]
        if name in self._visiting:
            raise ValueError(f"circular include may occur: {name}")
        self._visiting.add(name)
        try:
            path = next((d / name for d in self.include_dirs if (d / name).exists()), None)
            if path is None:
                raise FileNotFoundError(f"failed to open: {name}")
            self._done[name] = self.digest(path.read_bytes())
        finally:
            self._visiting.discard(name)
        return self._done[name]


@dataclass(frozen=True)
class DeepJitConfig:
    """What one installed DeepGEMM of this generation gives DeepJIT (its init_jit)."""

    include_dir: Path
    extra_signature: str  # "cutlass-<CUTLASS_VERSION>" of the CUTLASS it ships


def config_of(location: Path) -> DeepJitConfig:
    """The configuration of the DeepGEMM package at location (its include/ directory)."""
    include = Path(location) / "include"
    return DeepJitConfig(include, f"cutlass-{cutlass_version(include)}")


def cutlass_version(include: Path) -> int:
    """CUTLASS_VERSION (major * 100 + minor * 10 + patch) of include/cutlass/version.h."""
    text = (include / "cutlass" / "version.h").read_text(errors="replace")
    parts = {}
    for name in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"^#define CUTLASS_{name} (\d+)\s*$", text, re.M)
        if match is None:
            raise ValueError(f"{include}/cutlass/version.h defines no CUTLASS_{name}")
        parts[name] = int(match.group(1))
    return parts["MAJOR"] * 100 + parts["MINOR"] * 10 + parts["PATCH"]


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    """utils/env.hpp get<bool>: DG_X, else DJ_X; true/yes/false/no or an integer."""
    for prefix in (PREFIX, FALLBACK_PREFIX):
        value = env.get(f"{prefix}_{name}")
        if value is not None:
            text = value.strip().lower()
            if text in ("true", "yes", "false", "no"):
                return text in ("true", "yes")
            return int(text) != 0
    return False


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    for prefix in (PREFIX, FALLBACK_PREFIX):
        value = env.get(f"{prefix}_{name}")
        if value is not None:
            return int(value)
    return default


def arch_of(capability: tuple[int, int]) -> str:
    """The arch DeepGEMM compiles for: Device::get_arch (sm_90a, sm_100f...) as init_jit
    overrides it (100f on sm100 but sm101, 120f on sm120)."""
    major, minor = capability
    if major == 10 and minor != 1 or major == 12:
        return f"{major}0f"
    number = f"{major * 10 + minor}"
    return number if major < 9 else number + ("f" if major > 9 else "a")


def default_flags(capability: tuple[int, int], env: Mapping[str, str] | None = None) -> list[str]:
    """CompilerOptions::get_flags for DeepGEMM's default options on a GPU of capability,
    under env: the flags in every kernel's key and nvcc command."""
    env = env or {}
    debug = _env_flag(env, "JIT_DEBUG")
    flags = [f"--gpu-architecture=sm_{arch_of(capability)}", "-O3", "--compiler-options=-O3"]
    if debug or _env_flag(env, "JIT_PTXAS_VERBOSE"):
        flags.append("--ptxas-options=--verbose")
    flags.append("--ptxas-options=--register-usage-level=10")
    if _env_flag(env, "JIT_CHECK_NO_SPILLS"):
        flags.append("--ptxas-options=--warn-on-spills")
    if _env_flag(env, "JIT_CHECK_NO_LOCAL_MEMORY"):
        flags.append("--ptxas-options=--warn-on-local-memory-usage")
    if debug or _env_flag(env, "JIT_WITH_LINEINFO"):
        flags.append("--generate-line-info")
    flags += [f"-std=c++{_env_int(env, 'JIT_CPP_STANDARD', 20)}", "--compiler-options=-fPIC",
              "--compiler-options=-fconcepts", "--expt-relaxed-constexpr",
              "--expt-extended-lambda",
              # DeepGEMM's own (init_jit)
              "--diag-suppress=39,161,174,177,186,940",
              "--compiler-options=-Wno-deprecated-declarations,-Wno-abi"]
    if capability[0] == 12:
        flags.append("-gencode=arch=compute_120f,code=sm_120f")
    return flags


def cache_key(config: DeepJitConfig, nvcc_version: str, flags: list[str], source: str | bytes,
              hasher: SourceHasher | None = None) -> str:
    """Runtime::cache_key: the 32 hex digits of the kernel's entry name."""
    hasher = hasher or SourceHasher((config.include_dir,))
    return (Fnv1a().update(config.extra_signature).update(hex_digest(nvcc_version))
            .update(" ".join(flags)).update("").update(hasher.digest(source)).hexdigest())


def entry_name(tag: str, key: str) -> str:
    """DiskCache::entry: ``<tag>.<key>`` (the tag: the kernel's name, e.g.
    sm90_fp8_gemm_1d2d)."""
    if not tag or not re.fullmatch(r"[A-Za-z0-9_]+", tag):
        raise ValueError(f"cache tag must contain only letters, digits, or underscores: {tag}")
    return f"{tag}.{key}"


def job_template(flags: list[str], config: DeepJitConfig) -> list[str]:
    """The nvcc arguments DeepJIT runs for a kernel, as the kernel stage's shim records
    them (``{source}``/``{output}`` for the build directory's kernel.cu and kernel.cubin)."""
    return [SOURCE, "--cubin", "--output-file", OUTPUT, *flags,
            "--include-path", str(config.include_dir)]


def cache_roots(env: Mapping[str, str], home: Path) -> list[Path]:
    """DiskCache::from_env: DG_JIT_CACHE_DIR (else DJ_JIT_CACHE_DIR) split at ':', the
    first root written, the others only read; else ``$HOME/.dj``. ValueError for an empty
    item (DeepJIT refuses it)."""
    for prefix in (PREFIX, FALLBACK_PREFIX):
        value = env.get(f"{prefix}_JIT_CACHE_DIR")
        if value is not None:
            items = value.split(":")
            if not all(items):
                raise ValueError(f"disk cache path list contains an empty path: {value}")
            return [Path(item) for item in items]
    return [home / ".dj"]


def lookup(roots: list[Path], name: str) -> Path | None:
    """DiskCache::entry's hit: the first root whose ``cache/<name>/.committed`` exists."""
    for root in roots:
        entry = root / "cache" / name
        if (entry / ".committed").exists():
            return entry
    return None


def entry_key(entry: Path, config: DeepJitConfig, nvcc_version: str, flags: list[str]) -> str:
    """The key DeepJIT computes, on a node with this config, nvcc and flags, for the
    kernel an entry holds: the entry is a hit there only when it equals the key in its
    name (entry_name)."""
    return cache_key(config, nvcc_version, flags, (entry / "kernel.cu").read_bytes())


def template_source(package: Path, kernel: str, args: list[object]) -> str:
    """The kernel.cu DeepGEMM generates for kernel with these template arguments: the
    std::format template its extension holds for it, filled in. For showing and building
    a release's jobs without a GPU; on a GPU DeepGEMM's heuristics choose the arguments."""
    extension = next((p for p in sorted(Path(package).glob("_C*.so"))), None)
    if extension is None:
        raise FileNotFoundError(f"no _C*.so extension in {package}")
    data = extension.read_bytes()
    at = data.find(f"&{kernel}<".encode())
    if at < 0:
        raise ValueError(f"{extension.name} holds no source template for {kernel}")
    template = data[data.rindex(b"\0", 0, at) + 1:data.index(b"\0", at)].decode()
    values = iter(args)
    filled = re.sub(r"\{\{|\}\}|\{\}", lambda m: {"{{": "{", "}}": "}"}.get(m.group(0))
                    or str(next(values)), template)
    if next(values, None) is not None:
        raise ValueError(f"{kernel} takes fewer template arguments than given")
    return filled
