"""Library probes: what this process could import and JIT with, found without importing it.

Every probe runs once per process (cached) and never imports the library it probes: the
planner must stay cheap and must work on machines without torch or a GPU.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from warmd import settings
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
    module: str | None = None  # the import name, where the engine imports another than name

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
        }


# Libraries that are only probed: the planner asks whether a kernel's helper is there (nvcc,
# sgl-kernel's AOT kernels, CUTLASS DSL), but they have no JIT cache for warmd to warm, so
# they are not registered in warmd.libraries (whose every entry has an executor and a cache).
HELPERS = {"cutlass_dsl": "CUTLASS DSL", "sgl_kernel": "sgl-kernel", "nvcc": "nvcc"}
_HELPER_ALIASES = {"cutlass": "cutlass_dsl"}


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


_HELPER_PROBES = {
    "cutlass_dsl": probe_cutlass_dsl,
    "sgl_kernel": probe_sgl_kernel,
    "nvcc": probe_nvcc,
}


def _probes() -> dict:
    """Every probe: the registered JIT libraries', then the helpers'."""
    from warmd.libraries import LIBRARIES

    return {**{lib.name: lib.probe for lib in LIBRARIES.values()}, **_HELPER_PROBES}


def _follows_engine(name: str) -> bool:
    """Whether the library's probe takes the engine whose import order it follows."""
    from warmd.libraries import LIBRARIES

    library = LIBRARIES.get(name)
    return library is not None and library.probe_follows_engine


def probe_names() -> tuple[str, ...]:
    return tuple(_probes())


def display_name(name: str) -> str:
    """How messages name a library: 'DeepGEMM', 'FlashInfer', 'sgl-kernel'."""
    from warmd.libraries import LIBRARIES

    library = LIBRARIES.get(name)
    return library.display if library else HELPERS.get(name, name)


@cache
def probe_library(name: str, engine: str | None = None) -> LibraryProbe:
    """The library as this process (engine None) or the engine would find it."""
    name = check_library_name(name)
    probe = _probes()[name]
    return probe(engine) if engine is not None and _follows_engine(name) else probe()


def check_library_name(name: str) -> str:
    from warmd.libraries import LIBRARIES

    aliases = {**_HELPER_ALIASES, **{alias: lib.name for lib in LIBRARIES.values()
                                      for alias in lib.aliases}}
    normal = name.strip().lower().replace("-", "_")
    normal = aliases.get(normal, normal)
    if normal not in _probes():
        raise WarmdInputError(f"unknown library {name!r}; known libraries: "
                              f"{', '.join(probe_names())}")
    return normal


def probe_libraries(
    with_libs: tuple[str, ...] = (), without_libs: tuple[str, ...] = (),
    engine: str | None = None,
) -> dict[str, LibraryProbe]:
    """Every library's probe as the engine finds it, with --with/--without overrides
    applied for planning."""
    forced_on = {check_library_name(n) for n in with_libs}
    forced_off = {check_library_name(n) for n in without_libs}
    both = forced_on & forced_off
    if both:
        raise WarmdInputError(f"library {sorted(both)[0]!r} given to both --with and --without")
    result = {}
    for name in probe_names():
        if name in forced_off:
            result[name] = LibraryProbe(name, False, reason=f"{name} disabled by --without",
                                        overridden=True)
        elif name in forced_on:
            found = probe_library(name, engine)
            result[name] = replace(found, available=True, can_jit=True, overridden=True,
                                   reason=f"{name} assumed present by --with")
        else:
            result[name] = probe_library(name, engine)
    return result
