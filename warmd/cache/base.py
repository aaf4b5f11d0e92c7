"""Local cache adapters: one per JIT library, each knowing that library's on-disk layout.

An adapter lists the entries a warmup produced, packs one into a portable artifact (bytes),
and installs an artifact atomically so the library then finds it with zero compiles.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheEntry:
    """One compiled kernel or module as the library stores it."""

    library: str
    name: str  # unique within the library's cache root, e.g. kernel.sm90_fp8_gemm_1d2d.<hex>
    path: Path

    def to_json(self) -> dict:
        return {"library": self.library, "name": self.name, "path": str(self.path)}


class CacheAdapter(ABC):
    """The local side of the cache for one library."""

    library: str

    @property
    @abstractmethod
    def root(self) -> Path:
        """The directory the library reads and writes (as the engine configures it)."""

    @abstractmethod
    def list_entries(self) -> list[CacheEntry]:
        """Complete entries only: never one a build is still writing."""

    def watch_dirs(self) -> tuple[Path, ...]:
        """The directories where new entries appear (what capture watches)."""
        return (self.root,)

    @abstractmethod
    def pack(self, entry: CacheEntry) -> bytes:
        """A deterministic, portable archive of one entry."""

    @abstractmethod
    def install(self, name: str, artifact: bytes) -> CacheEntry:
        """Install an artifact atomically; refuse unsafe archives (raises UnsafeArtifact) and
        ones this node cannot use (raises IncompatibleHere)."""

    @abstractmethod
    def fingerprint_inputs(self) -> dict:
        """Everything this library's cache key depends on (version, arch, install path...)."""

    def for_gpu(self, arch: str, sms: int) -> CacheAdapter:
        """The same cache described as on that GPU (a builder's, building for its target):
        itself, unless the library keys its cache on the GPU it runs on (DeepGEMM)."""
        return self

    def is_up_to_date(self, name: str) -> tuple[bool, str]:
        """Whether the library would use this complete entry here as it is, and why not
        (FlashInfer: ninja would rebuild a module whose inputs changed); others: always."""
        return True, ""

    # Each fingerprint input: (why the library's key depends on it, what to change when two
    # nodes differ in it); and what is deliberately not an input, with why. Data, per
    # library: `warmd cache fingerprint --explain` and `warmd cache why` read them.
    input_reasons: dict[str, tuple[str, str]] = {}
    not_inputs: dict[str, str] = {}


class UnsafeArtifact(ValueError):
    """An artifact that must not be installed: traversal, links, devices, too large."""


class IncompatibleHere(UnsafeArtifact):
    """An artifact that is well formed but cannot hit on this node (the library would
    rebuild it: files missing here, a tool version it cannot relocate). Adapters raise it
    from install; the shared cache counts a miss here and leaves the entry for nodes that
    can use it."""
