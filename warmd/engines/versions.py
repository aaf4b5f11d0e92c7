"""Engine versions: read from the installed distribution's metadata (never by importing the
engine), or given with --engine-version; rules that changed between releases are keyed by
version ranges of these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

from warmd.errors import WarmdInputError

DISTRIBUTIONS = {"vllm": "vllm", "sglang": "sglang"}
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    """The release part of a version string: '0.11.0rc2+cu128' -> (0, 11, 0)."""
    match = _VERSION.match(text.strip())
    if not match:
        raise WarmdInputError(f"not a version: {text!r} (expected e.g. 0.11.0)")
    return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]


def installed_version(engine: str) -> str | None:
    """The engine's installed version from its distribution metadata; None when absent."""
    try:
        return metadata.version(DISTRIBUTIONS[engine])
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class VersionRange:
    """Releases lo <= v < hi; None on a side leaves it open."""

    lo: Version | None = None
    hi: Version | None = None

    def contains(self, version: Version | None) -> bool:
        """An unknown version is taken as the newest release: it falls in open-ended ranges."""
        if version is None:
            return self.hi is None
        return (self.lo is None or version >= self.lo) and (self.hi is None or version < self.hi)

    def describe(self) -> str:
        def show(v: Version) -> str:
            return ".".join(str(p) for p in v)
        if self.lo is None and self.hi is None:
            return "all"
        if self.lo is None:
            return f"< {show(self.hi)}"
        if self.hi is None:
            return f">= {show(self.lo)}"
        return f">= {show(self.lo)}, < {show(self.hi)}"


ALL_VERSIONS = VersionRange()


def resolve_version(engine: str, given: str | None) -> tuple[Version | None, str]:
    """The version rules are keyed on, and where it came from (for the plan's reasons)."""
    if given:
        return parse_version(given), f"--engine-version {given}"
    found = installed_version(engine)
    if found:
        return parse_version(found), f"installed {DISTRIBUTIONS[engine]} {found}"
    return None, f"{engine} not installed here: newest rules apply (pass --engine-version)"
