"""Library probes, the low-level part: what this process could import and JIT with, found
without importing it (the planner must stay cheap and work without torch or a GPU).

A probe function here looks at one library; the registry (warmd.libraries) names every
library and helper with its probe, and runs each once per process (``probe_library``).
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from warmd import settings


@dataclass(frozen=True)
class LibraryProbe:
    name: str
    available: bool
    version: str | None = None
    reason: str = ""
    can_jit: bool = False
    location: str | None = None
    overridden: bool = False
    module: str | None = None  # the import name, where the engine imports another than name
    display: str = ""  # how messages name the library (the registry sets it); "": its name
    # Why it is taken as present rather than found here: a plan for another GPU assumes
    # what the engine's release ships or pins (warmd.engines.shipped), e.g. "vendored by
    # vllm 0.34.0"; "" when probed here or set by --with/--without.
    assumed: str = ""

    @property
    def title(self) -> str:
        return self.display or self.name

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "available": self.available,
            "version": self.version,
            "can_jit": self.can_jit,
            "reason": self.reason,
            "location": self.location,
            "overridden": self.overridden,
            "module": self.module,
            "assumed": self.assumed or None,
        }


def dist_version(candidates: tuple[str, ...]) -> str | None:
    for dist in candidates:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def module_location(module: str) -> str | None:
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
    home = settings.cuda_home()
    nvcc = home / "bin" / "nvcc"
    if not nvcc.exists():
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


def probe_jit_library(name: str, module: str, distributions: tuple[str, ...], missing: str,
                      cannot_jit: str, jit_without_nvcc: bool = False) -> LibraryProbe:
    """A JIT library's probe: available when its module is found, able to JIT when nvcc is
    there (or, with jit_without_nvcc, prebuilt kernels are)."""
    location = module_location(module)
    if location is None:
        return LibraryProbe(name, False, reason=missing)
    can_jit = probe_nvcc().available or jit_without_nvcc
    return LibraryProbe(name, True, dist_version(distributions), reason="" if can_jit else
                        cannot_jit, can_jit=can_jit, location=location)


def probe_cutlass_dsl() -> LibraryProbe:
    location = module_location("cutlass")
    version = dist_version(("nvidia-cutlass-dsl",))
    if location is None or version is None:
        return LibraryProbe("cutlass_dsl", False, reason="CUTLASS DSL not installed "
                            "(pip install nvidia-cutlass-dsl)")
    return LibraryProbe("cutlass_dsl", True, version, can_jit=True, location=location)


def probe_sgl_kernel() -> LibraryProbe:
    location = module_location("sgl_kernel")
    if location is None:
        return LibraryProbe("sgl_kernel", False, reason="sgl-kernel not installed (module "
                            "sgl_kernel; SGLang's AOT kernels)")
    return LibraryProbe("sgl_kernel", True, dist_version(("sgl-kernel",)),
                        can_jit=True, location=location)
