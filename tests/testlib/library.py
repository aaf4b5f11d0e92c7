"""testlib's registration (see testlib/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testlib import NAME, ROOT_ENV
from warmd.libraries.base import CacheRoot, Library
from warmd.probes import LibraryProbe


@dataclass(frozen=True)
class _TestRoot(CacheRoot):
    """Not a warmd knob: tests give warmup this library's root, or a node context that
    holds it (NodeContext.of({ROOT_ENV: ...}))."""

    def default(self, environ=None) -> Path:
        given = (environ or {}).get(ROOT_ENV)
        return Path(given) if given else Path("/nonexistent/testlib-root")


def probe() -> LibraryProbe:
    return LibraryProbe(NAME, available=True, version="1.0", can_jit=True)


LIBRARY = Library(
    name=NAME,
    display="Test library",
    probe=probe,
    kernels=(),
    plugin_module="testlib.plugin",
    roots=(_TestRoot("testlib_dir", ROOT_ENV),),
    entries=lambda root: root,
    builds_without_gpu=True,
)
