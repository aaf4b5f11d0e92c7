"""What a JIT library registers with warmd, once, in its package's ``LIBRARY``, and what a
helper the planner only probes for (nvcc, sgl-kernel, CUTLASS DSL) registers: ``Helper``.

Registering imports no GPU library: the probe finds the library without importing it, and
what the library's code does (executor, cache adapter, worker environment, kernel stage,
re-derivation) is its plugin module, named in ``plugin_module`` and imported only where it
is used (``Library.plugin()``; warmd.libraries.plugin says what a plugin is).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmd import knobs
from warmd.kernels.base import Kernel
from warmd.libraries.plugin import LibraryPlugin
from warmd.probes import LibraryProbe

if TYPE_CHECKING:
    from warmd.cache.base import CacheAdapter
    from warmd.engines.cache_dirs import CacheDirs


@dataclass(frozen=True)
class CacheRoot:
    """A directory a library's cache depends on: the engine's variable for it (a knob in
    knobs.KNOBS) and its key under warmd.yaml's ``cache:`` section."""

    config_key: str
    env: str

    def default(self, environ: Mapping[str, str] | None = None) -> Path:
        """The root as a node's variables set it (default: this process's environment), or
        its default."""
        return knobs.get(self.env, environ)


@dataclass(frozen=True)
class Library:
    name: str  # as tasks, --library and warmd.yaml name it
    display: str  # as messages name it
    probe: Callable[..., LibraryProbe]  # found without importing the library
    kernels: tuple[type[Kernel], ...]  # its kernels (preference order: kernels/preferences.py)
    # the module whose PLUGIN (a warmd.libraries.plugin.LibraryPlugin) is its code
    plugin_module: str
    # roots[0] is the cache root the executor compiles into; later ones only feed its default
    roots: tuple[CacheRoot, ...]
    entries: Callable[[Path], Path]  # where under the root its entries lie (for sizes)
    builds_without_gpu: bool = False  # a GPU-less builder node warms it
    aliases: tuple[str, ...] = ()  # other spellings accepted by --with/--without
    # True: probe(engine) finds the library the way that engine imports it ("vllm",
    # "sglang"); probe() the way any engine could
    probe_follows_engine: bool = False

    @property
    def root(self) -> CacheRoot:
        return self.roots[0]

    def plugin(self) -> LibraryPlugin:
        """Its plugin (the plugin module imported once per process); ModuleNotFoundError
        when this warmd has no such module."""
        return load_plugin(self.plugin_module)

    def make_adapter(self, root: Path, arch: str, dirs: CacheDirs | None = None
                     ) -> CacheAdapter | None:
        """Its cache adapter at ``root`` for a target arch: the one way warmd builds one;
        ``dirs``: the directories the plan's engine reads (None: this process's settings).
        None when this warmd has no plugin module for it, or the library is not here."""
        try:
            plugin = self.plugin()
        except ModuleNotFoundError as exc:
            if not names_module(exc, self.plugin_module):
                raise
            return None
        return plugin.make_adapter(Path(root), arch, dirs)


@dataclass(frozen=True)
class Helper:
    """A library the planner only probes for (a kernel needs it), with no cache to warm."""

    name: str
    display: str
    probe: Callable[[], LibraryProbe]
    aliases: tuple[str, ...] = ()


@functools.cache
def load_plugin(module: str) -> LibraryPlugin:
    """The ``PLUGIN`` a plugin module defines; TypeError when it defines none."""
    plugin = getattr(importlib.import_module(module), "PLUGIN", None)
    if not isinstance(plugin, LibraryPlugin):
        raise TypeError(f"{module}.PLUGIN is not a warmd.libraries.plugin.LibraryPlugin")
    return plugin


def resolve(reference: str) -> Any:
    """The object a "module:attribute" reference names (imports the module); ValueError for
    a reference of another form."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} is not 'module.path:attribute'")
    return getattr(importlib.import_module(module_name), attribute)


def names_module(exc: ModuleNotFoundError, reference: str) -> bool:
    """Whether the module missing is the reference's own (not one it imports); a reference
    is "module:attribute" or a module."""
    return exc.name == reference.partition(":")[0]
