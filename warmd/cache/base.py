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

    @abstractmethod
    def pack(self, entry: CacheEntry) -> bytes:
        """A deterministic, portable archive of one entry."""

    @abstractmethod
    def install(self, name: str, artifact: bytes) -> CacheEntry:
        """Install an artifact atomically; refuse unsafe archives (raises UnsafeArtifact)."""

    @abstractmethod
    def fingerprint_inputs(self) -> dict:
        """Everything this library's cache key depends on (version, arch, install path...)."""


class UnsafeArtifact(ValueError):
    """An artifact that must not be installed: traversal, links, devices, too large."""


class IncompatibleEntry(UnsafeArtifact):
    """An artifact that is well formed but cannot hit on this node (the library would
    rebuild it): refused by the adapter, counted as a miss, never quarantined."""


class SharedCache(ABC):
    """The cluster-wide side of the cache (implemented by warmd.store over Redis).

    Warmup calls it per task, in this order: fetch_task (install what the cluster has),
    then for a miss single_flight (one node compiles, the others wait), then publish_task.
    Every method degrades instead of raising: store down, corrupt entry or refused signature
    is a miss, counted in the store's own counters.
    """

    @abstractmethod
    def fetch_task(self, adapter: CacheAdapter, task_key: str) -> list[str] | None:
        """Install every entry the cluster recorded for this task into adapter's root.
        Returns the entry names installed (already-present ones included), or None when the
        cluster has no complete, verified record for this task (a miss)."""

    @abstractmethod
    def single_flight(self, task_key: str, timeout: float):
        """Context manager yielding True when this process should compile the task, False
        when another node compiled it meanwhile (fetch_task again). Takes the lease over
        when its holder dies; yields True when the store is unreachable."""

    @abstractmethod
    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> None:
        """Publish the entries a task produced (once per entry cluster-wide) and the task's
        record naming them."""

    def prefetch(self, adapter: CacheAdapter, task_keys: list[str]
                 ) -> dict[str, list[str] | None]:
        """fetch_task for a whole plan at once (few round trips); same result per task."""
        return {key: self.fetch_task(adapter, key) for key in task_keys}

    def shard_order(self, task_keys: list[str]) -> list[str]:
        """The order this node should try the tasks in, so nodes warming the same plan
        together start on different tasks."""
        return list(task_keys)

    @abstractmethod
    def record_outcomes(self, counts: dict[str, float]) -> None:
        """Add this run's counters (local_hits, remote_hits, compiled, failed, seconds...)
        to the cluster-wide stats."""
