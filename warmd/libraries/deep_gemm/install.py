"""Which DeepGEMM an engine imports, found the engine's way and without importing anything.

vLLM (``vllm/utils/deep_gemm.py`` ``_import_deep_gemm``, 0.34.0) imports an external
``deep_gemm`` first and falls back to the copy vendored in its wheel,
``vllm.third_party.deep_gemm`` (DeepGEMM 2.8.1 in 0.34.0). SGLang
(``python/sglang/srt/layers/deep_gemm_wrapper/configurer.py``) imports ``deep_gemm`` only.
Without an engine the vLLM order applies: it finds whatever SGLang would, and more.

A DeepGEMM's *generation* says how its JIT names, lays out and keys a kernel (the kernel
stage, the cache adapter and the fingerprint follow it):

- ``nvcc_jit`` (sgl-deep-gemm 0.1.x, DeepGEMM 2.6): ``csrc/jit/compiler.hpp``. Entries
  ``<root>/cache/kernel.<name>.<32 hex>/`` holding ``kernel.cu`` and ``kernel.cubin``; nvcc
  called as ``<src> -cubin -o <out> <flags>``; the flags carry ``-I<package>/include``, so
  the install path is part of every key (nvcc_jit.py computes it).
- ``deep_jit`` (DeepGEMM 2.8, and sgl-deep-gemm 0.2.x, which ships DeepJIT's headers in
  ``deep_gemm/include/deep_jit``; deep_jit.py computes its keys): entries
  ``<root>/cache/<name>.<32 hex>/`` holding ``kernel.cu``, ``kernel.cubin``, ``meta.json``
  and the empty marker ``.committed`` (DeepJIT's test for a complete entry); nvcc called as
  ``<src> --cubin --output-file <out> <flags> --include-path <dir>``; the key hashes the
  ``nvcc --version`` output, the flags without the include directories and the source
  with the contents of the headers it includes, not where they live.

Any other version is unknown: warmd still warms it, without the kernel stage's fast path.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from warmd.engines.versions import Version, VersionRange, parse_version
from warmd.errors import WarmdInputError
from warmd.probes import dist_version

EXTERNAL = "deep_gemm"
VENDORED = "vllm.third_party.deep_gemm"
# PyPI's "deep-gemm" is an unrelated project.
DISTRIBUTIONS = ("sgl-deep-gemm", "deep_gemm")
# The modules each engine tries, in its order.
IMPORT_ORDER = {"vllm": (EXTERNAL, VENDORED), "sglang": (EXTERNAL,)}
ANY_ENGINE = (EXTERNAL, VENDORED)


class Generation(Enum):
    NVCC_JIT = "nvcc_jit"
    DEEP_JIT = "deep_jit"


@dataclass(frozen=True)
class GenerationRow:
    label: str
    versions: VersionRange
    generation: Generation
    source: str  # where its behaviour was read or measured


GENERATIONS = (
    GenerationRow("0.1.x", VersionRange((0, 1, 0), (0, 2, 0)), Generation.NVCC_JIT,
                  "sgl-deep-gemm 0.1.4.post1: csrc/jit/compiler.hpp, measured on the H200"),
    GenerationRow("2.6.x", VersionRange((2, 6, 0), (2, 7, 0)), Generation.NVCC_JIT,
                  "DeepGEMM 2.6.1: csrc/jit/compiler.hpp"),
    GenerationRow("2.8.x", VersionRange((2, 8, 0), (2, 9, 0)), Generation.DEEP_JIT,
                  "DeepGEMM 2.8.1 (vLLM 0.34.0): third-party/deep_jit, measured on the H200"),
    # SGLang 0.5.23's pin. Its _C.so loads with neither the H200's torch 2.11 nor a CPU
    # torch: read in its wheel (include/deep_jit, the _C.so's strings), never run.
    GenerationRow("0.2.x", VersionRange((0, 2, 0), (0, 3, 0)), Generation.DEEP_JIT,
                  "sgl-deep-gemm 0.2.3.post2 (SGLang 0.5.23): include/deep_jit in its wheel, "
                  "read on the CPU machine, not run; 0.2.0 and 0.2.5 ship the same DeepJIT "
                  "(0.2.5 with CUTLASS 4.8.1: another signature, other keys)"),
)
KNOWN_VERSIONS = ", ".join(row.label for row in GENERATIONS)
# What nvcc_jit (0.1.x csrc/jit/compiler.hpp) reads that changes a key; deep_jit's are in
# deep_jit.py (KEYED_ENV), each under DG_ and DJ_.
NVCC_JIT_KEY_ENV = ("DG_JIT_USE_NVRTC", "DG_JIT_NVCC_COMPILER", "DG_JIT_CPP_STANDARD",
                    "DG_JIT_WITH_LINEINFO", "DG_JIT_DEBUG", "DG_JIT_PTXAS_VERBOSE",
                    "DG_JIT_PTXAS_CHECK")


def nvrtc_on(value: str | None) -> bool:
    """DG_JIT_USE_NVRTC as sgl-deep-gemm 0.1.x reads it (get_env<int>: non-zero is on).
    SGLang always sets it, to "0" unless SGLANG_DG_USE_NVRTC is on."""
    try:
        return int((value or "0").strip() or "0") != 0
    except ValueError:
        return True  # not a number: DeepGEMM's parse fails; no fast path is promised


@dataclass(frozen=True)
class DeepGemmInstall:
    """One DeepGEMM package on this machine, as an engine would import it."""

    module: str  # the import name: deep_gemm or vllm.third_party.deep_gemm
    location: Path  # the package directory
    version: str | None

    @property
    def vendored(self) -> bool:
        return self.module == VENDORED

    @property
    def generation(self) -> Generation | None:
        """How this version's JIT works; None for a version warmd does not know."""
        return generation_of(self.version)

    def describe(self) -> str:
        where = "vendored in vLLM" if self.vendored else "installed"
        return f"{self.module} {self.version or '(version unknown)'}, {where}"


def generation_of(version: str | None) -> Generation | None:
    if not version:
        return None
    try:
        release: Version = parse_version(version)
    except WarmdInputError:
        return None
    for row in GENERATIONS:
        if row.versions.contains(release):
            return row.generation
    return None


def resolve(engine: str | None = None) -> DeepGemmInstall | None:
    """The DeepGEMM the engine (None: any) would import here, or None."""
    for module in IMPORT_ORDER.get(engine or "", ANY_ENGINE):
        location = _external() if module == EXTERNAL else _vendored()
        if location is not None:
            return DeepGemmInstall(module, location, _version(module, location))
    return None


def _external() -> Path | None:
    return _package_dir(EXTERNAL)


def _vendored() -> Path | None:
    """vllm/third_party/deep_gemm beside vLLM's own package: found from vLLM's top-level
    spec, which imports nothing (finding ``vllm.third_party.deep_gemm``'s spec would import
    vllm and vllm.third_party)."""
    vllm = _package_dir("vllm", every=True)
    for base in vllm or ():
        package = base / "third_party" / "deep_gemm"
        if (package / "__init__.py").is_file():
            return package
    return None


def _package_dir(name: str, every: bool = False):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    dirs = [Path(p) for p in spec.submodule_search_locations]
    return dirs if every else dirs[0]


def _version(module: str, location: Path) -> str | None:
    """What the package says of itself (its VERSION file, else the ``__version__`` literal
    of its __init__.py), else, for an external one, its distribution's version."""
    with contextlib.suppress(OSError):
        text = (location / "VERSION").read_text().strip()
        if text:
            return text
    literal = _version_literal(location / "__init__.py")
    if literal or module == VENDORED:
        return literal
    return dist_version(DISTRIBUTIONS)


def _version_literal(path: Path) -> str | None:
    """``__version__ = '2.8.1'`` read from the source, never executed."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(isinstance(t, ast.Name) and t.id == "__version__"
                        for t in node.targets)):
            return node.value.value
    return None
