"""What a node's capture covers: one ``CaptureScope`` per model the node warmed (its plan,
target and cache roots), and the cache adapters it watches there."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from warmd.cache.base import CacheAdapter

if TYPE_CHECKING:
    from warmd.engines.cache_dirs import CacheDirs
    from warmd.targets import Target


@dataclass(frozen=True)
class CaptureScope:
    """One model the node warmed: its plan key, the target it was planned for (part of every
    fingerprint) and each library's cache root on this node."""

    plan_key: str
    target: dict  # Target.to_json()
    roots: dict[str, str]  # library -> cache root
    # the plan's engine and its cache variables (CacheDirs.values): the stores it reads
    # beyond the roots (FlashInfer autotune's); empty: this process's settings
    engine: str = ""
    cache_env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CaptureScope:
        return cls(str(data["plan_key"]), dict(data["target"]),
                   {str(k): str(v) for k, v in data["roots"].items()},
                   str(data.get("engine") or ""),
                   {str(k): str(v) for k, v in (data.get("cache_env") or {}).items()})

    def cache_dirs(self) -> CacheDirs | None:
        from warmd.engines.cache_dirs import CacheDirs

        if not self.cache_env:
            return None
        return CacheDirs(self.engine, tuple(sorted(self.cache_env.items())))

    def target_object(self) -> Target:
        from warmd.targets import Target, parse_capability

        t = self.target
        return Target(t["name"], parse_capability(t["capability"]), int(t["sms"]),
                      int(t.get("count", 1)), t.get("driver"), t.get("cuda"),
                      t.get("source", "preset"))


def scope_of(plan, roots: dict[str, Path]) -> CaptureScope:
    """The capture scope of a plan warmed with these cache roots (WarmupOptions.cache_roots)."""
    dirs = plan.dirs()
    return CaptureScope(plan.key, plan.env.target.to_json(),
                        {lib: str(root) for lib, root in roots.items()}, dirs.engine,
                        dict(dirs.values))


def adapters_for(scope: CaptureScope) -> dict[str, CacheAdapter]:
    """Every registered library's cache adapter at the scope's roots, for the libraries
    installed here (nothing else can compile into a cache, or use an installed entry)."""
    from warmd.libraries import LIBRARIES, probe_library

    arch, dirs = scope.target_object().arch, scope.cache_dirs()
    found = {}
    for name, library in LIBRARIES.items():
        if not probe_library(name).available:
            continue
        root = Path(scope.roots.get(name) or library.root.default())
        try:
            adapter = library.make_adapter(root, arch, dirs)
        except ModuleNotFoundError:  # the library's own imports: nothing to watch, no crash
            adapter = None
        if adapter is not None:
            found[name] = adapter
    return found
