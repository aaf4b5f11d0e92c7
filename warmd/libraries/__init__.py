"""The one registry of libraries: the JIT libraries warmd warms (one package each under
warmd/libraries/, ``LIBRARIES``) and the helpers the planner only probes for (``HELPERS``).

A package's ``LIBRARY`` (a ``warmd.libraries.base.Library``) says everything warmd needs of
it: name, probe, kernels, cache roots, and its plugin module (executor, cache adapter, worker
environment...: a ``warmd.libraries.plugin.LibraryPlugin``). Every
list of libraries in warmd (CLI choices, config validation, the worker pool, the node's
work, the cache commands) reads ``LIBRARIES``. Adding a library is its package: every
package here is registered, in name order. Helpers (cutlass_dsl, sgl_kernel, nvcc) have no
cache to warm; a kernel may need one. Every name either kind answers to is probed here, once
per process (``probe_library``), with the probe functions of warmd.probes.

A package kept outside warmd registers the same way: ``register("package")`` in this
process, and ``WARMD_LIBRARY_PACKAGES=package`` for every process warmd starts (its worker
processes register the packages that variable names when they import this module).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from dataclasses import replace
from functools import cache

from warmd import settings
from warmd.errors import WarmdInputError
from warmd.libraries.base import CacheRoot, Helper, Library
from warmd.probes import LibraryProbe, probe_cutlass_dsl, probe_nvcc, probe_sgl_kernel

LIBRARIES: dict[str, Library] = {}
HELPERS: dict[str, Helper] = {h.name: h for h in (
    Helper("cutlass_dsl", "CUTLASS DSL", probe_cutlass_dsl, aliases=("cutlass",)),
    Helper("sgl_kernel", "sgl-kernel", probe_sgl_kernel),
    Helper("nvcc", "nvcc", probe_nvcc),
)}

__all__ = ["HELPERS", "LIBRARIES", "CacheRoot", "Helper", "Library", "cache_roots",
           "check_library_name", "display_name", "names", "probe_libraries", "probe_library",
           "probe_names", "register", "unregister"]

log = logging.getLogger(__name__)


def register(package: str) -> Library:
    """Register the library a package defines in its ``LIBRARY``; registering it again
    replaces it. WarmdInputError when the package cannot be imported or has no LIBRARY."""
    try:
        library = importlib.import_module(package).LIBRARY
    except ImportError as exc:
        raise WarmdInputError(f"cannot register library package {package!r}: {exc}") from None
    except AttributeError:
        raise WarmdInputError(f"library package {package!r} defines no LIBRARY"
                              + _half_imported(package)) from None
    if not isinstance(library, Library):
        raise WarmdInputError(f"{package}.LIBRARY is not a warmd.libraries.base.Library")
    LIBRARIES[library.name] = library
    return library


def _half_imported(package: str) -> str:
    module = sys.modules.get(package)
    if module is None or not getattr(module.__spec__, "_initializing", False):
        return ""
    return (" yet: it was imported before warmd.libraries (an import cycle); name a module "
            "that only defines LIBRARY and that nothing else imports")


def unregister(name: str) -> None:
    """Forget a registered library (a no-op for an unknown name)."""
    LIBRARIES.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(LIBRARIES)


def cache_roots() -> tuple[CacheRoot, ...]:
    """Every cache root of every library (warmd.yaml's ``cache:`` keys)."""
    return tuple(root for library in LIBRARIES.values() for root in library.roots)


def _known() -> dict[str, Library | Helper]:
    """Every name the probes answer to: the registered libraries', then the helpers'."""
    return {**LIBRARIES, **HELPERS}


def probe_names() -> tuple[str, ...]:
    return tuple(_known())


def display_name(name: str) -> str:
    """How messages name a library: 'DeepGEMM', 'FlashInfer', 'sgl-kernel'."""
    known = _known().get(name)
    return known.display if known else name


def check_library_name(name: str) -> str:
    """The registered name for a spelling (case, dashes, aliases); WarmdInputError for one
    the registry does not know."""
    known = _known()
    aliases = {alias: entry.name for entry in known.values() for alias in entry.aliases}
    normal = name.strip().lower().replace("-", "_")
    normal = aliases.get(normal, normal)
    if normal not in known:
        raise WarmdInputError(f"unknown library {name!r}; known libraries: "
                              f"{', '.join(probe_names())}")
    return normal


@cache
def probe_library(name: str, engine: str | None = None) -> LibraryProbe:
    """What this process (engine None) or the engine would find of the library or helper;
    probed once per process. Only a library whose probe follows the engine's import order
    (``Library.probe_follows_engine``: DeepGEMM, vendored in vLLM) looks at the engine."""
    known = _known()[check_library_name(name)]
    if engine is not None and isinstance(known, Library) and known.probe_follows_engine:
        return known.probe(engine)
    return known.probe()


def probe_libraries(
    with_libs: tuple[str, ...] = (), without_libs: tuple[str, ...] = (),
    engine: str | None = None,
) -> dict[str, LibraryProbe]:
    """Every library's probe as the engine finds it, with --with/--without overrides applied
    for planning, each carrying the name messages use for it (a kernel's reasons say
    'DeepGEMM unavailable')."""
    forced_on = {check_library_name(n) for n in with_libs}
    forced_off = {check_library_name(n) for n in without_libs}
    both = forced_on & forced_off
    if both:
        raise WarmdInputError(f"library {sorted(both)[0]!r} given to both --with and --without")
    result = {}
    for name in probe_names():
        if name in forced_off:
            probe = LibraryProbe(name, False, reason=f"{name} disabled by --without",
                                 overridden=True)
        elif name in forced_on:
            probe = replace(probe_library(name, engine), available=True, can_jit=True,
                            overridden=True, reason=f"{name} assumed present by --with")
        else:
            probe = probe_library(name, engine)
        result[name] = replace(probe, display=display_name(name))
    return result


def _register_all() -> None:
    for package in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
        register(f"{__name__}.{package}")
    for package in settings.library_packages():
        try:
            register(package)
        except WarmdInputError as exc:  # one library missing must not stop warmd
            log.warning("WARMD_LIBRARY_PACKAGES: %s; ignored", exc)


_register_all()
