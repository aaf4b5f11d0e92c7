"""The JIT libraries warmd warms: one package each under warmd/libraries/, registered here.

A package's ``LIBRARY`` (a ``warmd.libraries.base.Library``) says everything warmd needs of
it: name, probe, kernels, executor, cache adapter, worker environment, cache roots. Every
list of libraries in warmd (CLI choices, config validation, the worker pool, the node's
work, the cache commands, the probes) reads ``LIBRARIES``. Adding a library is its package:
every package here is registered, in name order. Helper libraries that are only probed
(cutlass_dsl, sgl_kernel, nvcc) are not registered: they have no cache to warm (see
warmd/probes.py).

A package kept outside warmd registers the same way: ``register("package")`` in this
process, and ``WARMD_LIBRARY_PACKAGES=package`` for every process warmd starts (its worker
processes register the packages that variable names when they import this module).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

from warmd import settings
from warmd.errors import WarmdInputError
from warmd.libraries.base import CacheRoot, Library, resolve

LIBRARIES: dict[str, Library] = {}

__all__ = ["LIBRARIES", "CacheRoot", "Library", "cache_roots", "names", "register", "resolve",
           "unregister"]

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


def _register_all() -> None:
    for package in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
        register(f"{__name__}.{package}")
    for package in settings.library_packages():
        try:
            register(package)
        except WarmdInputError as exc:  # one library missing must not stop warmd
            log.warning("WARMD_LIBRARY_PACKAGES: %s; ignored", exc)


_register_all()
