"""The JIT libraries warmd warms: one package each under warmd/libraries/, registered here.

A package's ``LIBRARY`` (a ``warmd.libraries.base.Library``) says everything warmd needs of
it: name, probe, kernels, executor, cache adapter, worker environment, cache roots. Every
list of libraries in warmd (CLI choices, config validation, the worker pool, the node's
work, the cache commands, the probes) reads ``LIBRARIES``. Adding a library is its package
plus one line below. Helper libraries that are only probed (cutlass_dsl, sgl_kernel, nvcc)
are not registered: they have no cache to warm (see warmd/probes.py).
"""

from __future__ import annotations

import importlib

from warmd.libraries.base import CacheRoot, Library, resolve

_PACKAGES = (
    "deep_gemm",
    "flashinfer",
    "flashinfer_autotune",
    "triton",
)

LIBRARIES: dict[str, Library] = {}
for _package in _PACKAGES:
    _library = importlib.import_module(f"{__name__}.{_package}").LIBRARY
    LIBRARIES[_library.name] = _library

__all__ = ["LIBRARIES", "CacheRoot", "Library", "cache_roots", "names", "resolve"]


def names() -> tuple[str, ...]:
    return tuple(LIBRARIES)


def cache_roots() -> tuple[CacheRoot, ...]:
    """Every cache root of every library (warmd.yaml's ``cache:`` keys)."""
    return tuple(root for library in LIBRARIES.values() for root in library.roots)
