"""The JIT libraries an engine release ships in its wheel (vendored) or pins in its
requirements, as data (data/shipped_libraries.json, read from the released wheels).

A plan for another machine's GPU (a --target preset or --capability) is a plan for a node
that runs the engine, not for this box: where the engine's release is known, it assumes the
libraries that release brings, at the versions it brings, unless --with/--without says
otherwise, and says so (`LibraryProbe.assumed`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

from warmd.engines.versions import Version, parse_version
from warmd.probes import LibraryProbe

DATA = Path(__file__).parent / "data" / "shipped_libraries.json"


@dataclass(frozen=True)
class ShippedLibrary:
    name: str  # warmd's library name
    version: str
    how: str  # "vendored" (inside the engine's wheel) or "pinned" (an exact requirement)
    module: str | None = None  # the import name, where the engine imports another


@dataclass(frozen=True)
class ShippedRelease:
    engine: str
    release: str
    libraries: tuple[ShippedLibrary, ...]
    source: str  # where the data was read
    newest: bool = False  # taken as the newest release warmd knows (the version unknown)

    def describe(self) -> str:
        """'vllm 0.34.0' (and, the version unknown, that it was taken as the newest)."""
        return f"{self.engine} {self.release}" + (" (newest known)" if self.newest else "")

    def to_json(self) -> dict:
        return {"engine": self.engine, "release": self.release, "newest": self.newest,
                "source": self.source,
                "libraries": {lib.name: {"version": lib.version, "how": lib.how,
                                         "module": lib.module} for lib in self.libraries}}


@functools.cache
def _releases() -> dict[str, dict[str, dict]]:
    data = json.loads(DATA.read_text())
    return {engine: releases for engine, releases in data.items() if not engine.startswith("_")}


def shipped_release(engine: str, version: Version | None) -> ShippedRelease | None:
    """What the engine's release ships or pins; version None (not given, not installed
    here): the newest release the data knows, as the engine's newest rules apply then.
    None for a release the data does not hold: the plan then probes this machine."""
    releases = _releases().get(engine, {})
    if not releases:
        return None
    by_version = {parse_version(text): text for text in releases}
    wanted = max(by_version) if version is None else version
    if wanted not in by_version:
        return None
    text = by_version[wanted]
    entry = releases[text]
    libraries = tuple(ShippedLibrary(name, lib["version"], lib["how"], lib.get("module"))
                      for name, lib in sorted(entry["libraries"].items()))
    return ShippedRelease(engine, text, libraries, entry["source"], newest=version is None)


def assume_shipped(probes: dict[str, LibraryProbe], release: ShippedRelease
                   ) -> dict[str, LibraryProbe]:
    """probes with each library the release ships or pins taken as present at its version,
    whatever this machine has; a library --with or --without set (overridden), or found
    here at that version under that module (this box has what the engine brings), is left
    as probed."""
    out = dict(probes)
    for lib in release.libraries:
        probe = out.get(lib.name)
        if probe is None or probe.overridden or _same(probe, lib):
            continue
        out[lib.name] = replace(
            probe, available=True, version=lib.version, can_jit=True, reason="",
            location=None, module=lib.module or probe.module,
            assumed=f"{lib.how} by {release.describe()}")
    return out


def _same(probe: LibraryProbe, lib: ShippedLibrary) -> bool:
    return (probe.available and probe.version == lib.version
            and (lib.module is None or probe.module == lib.module))
