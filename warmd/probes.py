"""Library probes: what this process could import and JIT with, found without importing it.

Every probe runs once per process (cached) and never imports the library it probes: the
planner must stay cheap and must work on machines without torch or a GPU.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from warmd.errors import WarmdInputError


@dataclass(frozen=True)
class LibraryProbe:
    name: str
    available: bool
    version: str | None = None
    reason: str = ""
    can_jit: bool = False
    location: str | None = None
    overridden: bool = False

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "available": self.available,
            "version": self.version,
            "can_jit": self.can_jit,
            "reason": self.reason,
            "location": self.location,
            "overridden": self.overridden,
        }


LIBRARIES = ("deep_gemm", "flashinfer", "cutlass_dsl", "sgl_kernel", "nvcc")

# Distributions that ship each module; PyPI's "deep-gemm" is an unrelated project.
_DISTRIBUTIONS = {
    "deep_gemm": ("sgl-deep-gemm", "deep_gemm"),
    "flashinfer": ("flashinfer-python",),
    "cutlass_dsl": ("nvidia-cutlass-dsl",),
    "sgl_kernel": ("sgl-kernel",),
}
_AOT_PACKAGES = ("flashinfer-cubin", "flashinfer-jit-cache")


def cuda_home() -> Path | None:
    """CUDA_HOME/CUDA_PATH, else /usr/local/cuda (where torch and FlashInfer look), else the
    toolkit around the nvcc on PATH (which may be a wrapper script, hence last)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    default = Path("/usr/local/cuda")
    if (default / "bin" / "nvcc").exists():
        return default
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def _dist_version(candidates: tuple[str, ...]) -> str | None:
    for dist in candidates:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_location(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(next(iter(spec.submodule_search_locations)))
    return spec.origin


def probe_nvcc() -> LibraryProbe:
    home = cuda_home()
    nvcc = home / "bin" / "nvcc" if home else None
    if nvcc is None or not nvcc.exists():
        return LibraryProbe("nvcc", False,
                            reason="nvcc not found (set CUDA_HOME or add it to PATH)")
    return LibraryProbe("nvcc", True, _cuda_toolkit_version(home), can_jit=True, location=str(nvcc))


def _cuda_toolkit_version(home: Path) -> str | None:
    # Read the toolkit's own metadata rather than running nvcc: probes have no side effects.
    for candidate in [*sorted(home.glob("dist-info/nvidia_cuda_nvcc-*/METADATA")),
                      home / "version.txt"]:
        try:
            for line in candidate.read_text().splitlines():
                if line.startswith("Version:") or line.startswith("CUDA Version"):
                    return line.split()[-1]
        except OSError:
            continue
    include = home / "include" / "cuda.h"
    try:
        for line in include.read_text(errors="replace").splitlines():
            if line.startswith("#define CUDA_VERSION "):
                value = int(line.split()[2])
                return f"{value // 1000}.{(value % 1000) // 10}"
    except (OSError, ValueError):
        pass
    return None


def probe_deep_gemm() -> LibraryProbe:
    location = _module_location("deep_gemm")
    if location is None:
        return LibraryProbe("deep_gemm", False, reason="DeepGEMM not installed (module deep_gemm; "
                            "pip install sgl-deep-gemm)")
    nvcc = probe_nvcc()
    return LibraryProbe(
        "deep_gemm", True, _dist_version(_DISTRIBUTIONS["deep_gemm"]), can_jit=nvcc.available,
        reason="" if nvcc.available else "DeepGEMM installed but nvcc missing: it cannot JIT",
        location=location,
    )


def probe_flashinfer() -> LibraryProbe:
    location = _module_location("flashinfer")
    if location is None:
        return LibraryProbe("flashinfer", False, reason="FlashInfer not installed (module "
                            "flashinfer; pip install flashinfer-python)")
    aot = [pkg for pkg in _AOT_PACKAGES if _dist_version((pkg,))]
    nvcc = probe_nvcc()
    can_jit = nvcc.available or bool(aot)
    reason = "" if can_jit else "FlashInfer installed but neither nvcc nor AOT packages found"
    return LibraryProbe("flashinfer", True, _dist_version(_DISTRIBUTIONS["flashinfer"]),
                        reason=reason, can_jit=can_jit, location=location)


def probe_cutlass_dsl() -> LibraryProbe:
    location = _module_location("cutlass")
    version = _dist_version(_DISTRIBUTIONS["cutlass_dsl"])
    if location is None or version is None:
        return LibraryProbe("cutlass_dsl", False, reason="CUTLASS DSL not installed "
                            "(pip install nvidia-cutlass-dsl)")
    return LibraryProbe("cutlass_dsl", True, version, can_jit=True, location=location)


def probe_sgl_kernel() -> LibraryProbe:
    location = _module_location("sgl_kernel")
    if location is None:
        return LibraryProbe("sgl_kernel", False, reason="sgl-kernel not installed (module "
                            "sgl_kernel; SGLang's AOT kernels)")
    return LibraryProbe("sgl_kernel", True, _dist_version(_DISTRIBUTIONS["sgl_kernel"]),
                        can_jit=True, location=location)


_PROBES = {
    "deep_gemm": probe_deep_gemm,
    "flashinfer": probe_flashinfer,
    "cutlass_dsl": probe_cutlass_dsl,
    "sgl_kernel": probe_sgl_kernel,
    "nvcc": probe_nvcc,
}


@cache
def probe_library(name: str) -> LibraryProbe:
    return _PROBES[check_library_name(name)]()


def check_library_name(name: str) -> str:
    normal = name.strip().lower().replace("-", "_")
    normal = {"deepgemm": "deep_gemm", "cutlass": "cutlass_dsl"}.get(normal, normal)
    if normal not in _PROBES:
        raise WarmdInputError(f"unknown library {name!r}; known libraries: {', '.join(LIBRARIES)}")
    return normal


def probe_libraries(
    with_libs: tuple[str, ...] = (), without_libs: tuple[str, ...] = ()
) -> dict[str, LibraryProbe]:
    """Every library's probe, with --with/--without overrides applied for planning."""
    forced_on = {check_library_name(n) for n in with_libs}
    forced_off = {check_library_name(n) for n in without_libs}
    both = forced_on & forced_off
    if both:
        raise WarmdInputError(f"library {sorted(both)[0]!r} given to both --with and --without")
    result = {}
    for name in LIBRARIES:
        if name in forced_off:
            result[name] = LibraryProbe(name, False, reason=f"{name} disabled by --without",
                                        overridden=True)
        elif name in forced_on:
            found = probe_library(name)
            result[name] = replace(found, available=True, can_jit=True, overridden=True,
                                   reason=f"{name} assumed present by --with")
        else:
            result[name] = probe_library(name)
    return result
