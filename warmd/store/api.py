"""What warmup, the daemon and the CLI need from a store: the one declaration of it.

Two interfaces, one per kind of data, each implemented once over any key-value backend
(warmd.store.shared and warmd.store.nodes over warmd.store.backend: Redis or SQLite; a shared
filesystem or S3 would add a backend, not a pair of these):

- SharedCache: the cluster-wide compiled-kernel cache: its entries (fetch, publish), claims
  (single flight, claims on work, shard order), kernel lists and learned entries, pending
  captures and stats (SharedEntries, SharedClaims, SharedKernelLists, SharedCaptures,
  SharedStats: each a part of its own), and its health.
- NodeRecords: the daemon's per-node state records and the controller's summary.

Every method degrades instead of raising: a store that is down, slow, full or refusing this
user's writes turns into misses, skipped publications and False/None answers, counted in the
backend's counters. Only operator commands (warmd.store.admin) see StoreFailed.

This lives in the store package, not next to the cache adapters in warmd.cache.base: it
covers more than the cache's key/value traffic (health, node records, operator counters).
Warmup depends on it for annotations only, so warming without any store imports no store
client.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.coordination import Claim, KernelList, WorkKind

if TYPE_CHECKING:
    from warmd.store.pending import PendingCapture


class StoreFailed(Exception):
    """One store operation failed. `kind` says what warmd does about it: "down" and "auth"
    (the store is unusable for a while), "denied", "readonly" and "oom" (writes refused,
    reads work), "disabled" and "open" (not even tried), "error" (anything else)."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message or kind)
        self.kind = kind


@dataclass(frozen=True)
class Publication:
    """What one publish_task did: entries it wrote, entries another node had published
    already (both now in the store), or why it published nothing (`skipped`)."""

    written: int = 0
    already_published: int = 0
    skipped: str | None = None

    @property
    def stored(self) -> bool:
        """Whether the store now holds the task's entries (by this call or before it)."""
        return self.skipped is None and self.written + self.already_published > 0


@dataclass(frozen=True)
class PeerAnswer:
    """What the cluster's other nodes said of some blobs (by content digest)."""

    blobs: dict[str, tuple[bytes, str]]  # digest -> (bytes a peer served, which peer):
    #                                      not verified yet
    from_store: tuple[str, ...] = ()  # digests this node reads from the store (and offers)
    later: tuple[str, ...] = ()  # digests another node is reading from the store now


class BlobPeers(Protocol):
    """Other nodes of the cluster serving the content-addressed blobs they installed and
    verified (warmd.cluster.fanout over Ray's object store). A shared cache given peers
    asks them before the store; every blob they serve is verified against its manifest
    exactly like one from the store, and one that fails is refused, said (`refused`) and
    read from the store instead. Never raises: a peer problem is a store read."""

    def lookup(self, digests: list[str]) -> PeerAnswer: ...

    def refused(self, digest: str, peer: str) -> None:
        """The bytes `peer` served for digest did not verify: never ask it for them again."""

    def offer(self, blobs: dict[str, bytes]) -> None:
        """Verified blobs this node now serves to the others."""


class SharedEntries(Protocol):
    """The cluster's entries (the cache's `entries`): fetch what a task needs, publish what
    it built. Never raises: a store problem is a miss or a skipped publication."""

    def fetch_task(self, adapter: CacheAdapter, task_key: str) -> list[str] | None:
        """Install every entry the cluster recorded for this task into adapter's root.
        Returns the entry names installed (already-present ones included), or None when the
        cluster has no complete, verified record for this task (a miss)."""

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        """fetch_task for a whole plan at once (few round trips); same result per task."""

    def installed_seconds(self, library: str, name: str) -> float | None:
        """The compile seconds recorded with an entry this process installed (what its
        remote hit saved); None for an entry it did not install."""

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> Publication:
        """Publish the entries a task produced (once per entry cluster-wide) and the task's
        record naming them; says what it did."""

    def publish_entries(self, adapter: CacheAdapter, entries: list[CacheEntry],
                        compile_seconds: float) -> Publication:
        """Publish entries at once, without a task record (what a task's record names
        is published with publish_task)."""

    def install_entries(self, adapter: CacheAdapter, names: list[str]) -> list[str]:
        """Install these entries from the cluster (verified); the names now present."""


class SharedClaims(Protocol):
    """Who builds what (the cache's `claims`): single flight per task, and claims on units
    of cluster work (an entry, or a task whose entries are not known before it runs)
    taken cluster-wide before they are compiled (a claim is on work only: what nodes
    captured is a pending capture, SharedCaptures). Never raises: without a store every
    unit is this node's."""

    def single_flight(self, task_key: str, timeout: float
                      ) -> contextlib.AbstractContextManager[bool]:
        """Context manager yielding True when this process should compile the task, False
        when another node compiled it meanwhile (fetch_task again). Takes the lease over
        when its holder dies; yields True when the store is unreachable."""

    def claim(self, adapter: CacheAdapter, unit: str, kind: WorkKind = WorkKind.ENTRY
              ) -> Claim:
        """Claim a unit without waiting: an entry, a task (by its key), or a discovery
        slice (by its task digest: PUBLISHED once its kernel list is); a held claim is
        renewed until ``release``. Without a store to share with: always MINE."""

    def release(self, adapter: CacheAdapter, unit: str, kind: WorkKind = WorkKind.ENTRY
                ) -> None:
        """Give a claim up (after publishing what it built, or after failing)."""

    def stop_waiting(self, adapter: CacheAdapter, unit: str, waited: float) -> None:
        """A unit held by another node for longer than the single-flight timeout: built
        here without its claim (counted: lease_timeouts)."""

    def wait(self, adapter: CacheAdapter, seconds: float) -> None:
        """Wait up to seconds for a claim of this adapter's library to be released."""

    def shard_order(self, task_keys: list[str]) -> list[str]:
        """The order this node should try the tasks in, so nodes warming the same plan
        together start on different tasks."""


class SharedKernelLists(Protocol):
    """What discoveries and serving engines learnt (the cache's `lists`): kernel lists,
    and the entries the engine compiled that no plan named (warmd.capture). Never raises:
    a store problem reads as nothing known and publishes nothing."""

    def kernel_list(self, adapter: CacheAdapter, tasks: list[str]) -> KernelList:
        """The published kernel lists of these tasks (by task digest), with their jobs:
        what any node of this library build and GPU learnt, in any namespace."""

    def publish_kernel_list(self, adapter: CacheAdapter, digest: str,
                            tasks: dict[str, list[str]], jobs: dict[str, dict],
                            also: dict[str, list[str]] | None = None) -> bool:
        """Publish a discovery's kernel list: each task's entries, each entry's job
        (signed when signing is on), then the mark that the discovery of digest is done."""

    def add_learned(self, adapter: CacheAdapter, plan_key: str, names: list[str]) -> bool:
        """Add entries (each already published as its own task, warmd.capture.sharing.learned_task)
        to the plan's learned index; a set, so nodes adding at once lose nothing. False when
        the store did not take it (or keeps no index)."""

    def learned(self, adapter: CacheAdapter, plan_key: str) -> list[str]:
        """The entry names in the plan's learned index (empty when none or unreachable)."""


class SharedCaptures(Protocol):
    """The pending tier (the cache's `captures`): what nodes captured, held until a trusted
    producer re-derives it. Never raises for store trouble (False, [] or None)."""

    def submit(self, adapter: CacheAdapter, plans: list[str], name: str, artifact: bytes,
               compile_seconds: float = 0.0) -> bool:
        """Store what a node captured as a pending capture (unsigned, never installed by any
        node); False when the store did not take it."""

    def pending(self, adapter: CacheAdapter) -> list[str]:
        """The names of the pending captures under the adapter's fingerprint, oldest first."""

    def read(self, adapter: CacheAdapter, name: str) -> tuple[PendingCapture, bytes] | None:
        """A pending capture and its artifact, checked against its digest; None when
        absent or unreachable. Raises warmd.store.validation.BadRecord for a malformed capture."""

    def drop(self, adapter: CacheAdapter, name: str, chunks: int = 0) -> bool:
        """Remove a pending capture (re-derived and published, or refused)."""


class SharedStats(Protocol):
    """Counters and compile times (the cache's `stats`). Never raises."""

    def record_outcomes(self, counts: dict[str, float]) -> None:
        """Add this run's counters (warmd.stats.Counters.to_json(); a key 'LIB.NAME' counts
        for that library only) to the cluster-wide stats."""

    @property
    def counters(self) -> dict[str, float]:
        """This process's store counters so far (a copy; names from warmd.stats.COUNTERS)."""

    def record_compile_times(self, times: dict[str, tuple[int, float]]) -> None:
        """Add (tasks compiled, seconds) per kernel family to the cluster's history (a
        store without one keeps nothing)."""

    def compile_times(self, families: list[str]) -> dict[str, float]:
        """Mean compile seconds per task of each family with a history (none: {})."""


class SharedCache(ABC):
    """The cluster-wide side of the kernel cache: five parts and its health.

    Warmup calls it per task, in this order: entries.fetch_task (install what the cluster
    has), then for a miss claims.single_flight (one node compiles, the others wait), then
    entries.publish_task; at the end stats.record_outcomes with the run's counters, then
    close.
    """

    entries: SharedEntries
    claims: SharedClaims
    lists: SharedKernelLists
    captures: SharedCaptures
    stats: SharedStats

    # -- health and identity ---------------------------------------------------------------

    @property
    @abstractmethod
    def display_url(self) -> str:
        """Where the store is, safe to print (no secrets)."""

    @property
    @abstractmethod
    def disabled_reason(self) -> str | None:
        """Why the cache is off (then every call is a miss); None when it is on."""

    @property
    @abstractmethod
    def last_error(self) -> str | None:
        """The last store failure, secrets scrubbed; None before any."""

    @abstractmethod
    def ping(self) -> bool:
        """Whether the store answers now (a failure makes later calls misses for a while)."""

    @property
    @abstractmethod
    def reachable(self) -> bool:
        """False while the store is known to be down (after a failed call, until it answers
        again); True otherwise, including before the first call."""

    @abstractmethod
    def close(self) -> None:
        """Flush pending counters and release connections; the cache is unusable after."""

    def __enter__(self) -> SharedCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NodeRecord(Protocol):
    """What node records hold (warmd.cluster.state.NodeState)."""

    node_id: str

    def to_json(self) -> dict: ...


class NodeRecords(ABC):
    """The daemon's node records for one namespace, and its controller's summary. Never
    raises for store trouble: a failed write returns False and counts in `errors`, a failed
    read returns None; `last_error` says why (secrets scrubbed)."""

    namespace: str
    ttl: int  # seconds a node record lives unless written again
    errors: int = 0
    last_error: str = ""

    def __init__(self, decode: Callable[[dict], Any] = dict) -> None:
        self.decode = decode  # turns a stored record back into what was put

    @property
    @abstractmethod
    def url(self) -> str | None:
        """The store URL these records live at (None: no store)."""

    @property
    def healthy(self) -> bool:
        return bool(self.url) and not self.last_error

    @abstractmethod
    def put(self, record: NodeRecord) -> bool: ...

    @abstractmethod
    def get_all(self) -> list | None:
        """Every live node record, decoded; None when the store could not be read."""

    @abstractmethod
    def delete(self, node_id: str) -> bool: ...

    @abstractmethod
    def put_daemon(self, info: dict) -> bool: ...

    @abstractmethod
    def get_daemon(self) -> dict | None: ...

    @abstractmethod
    def delete_daemon(self) -> bool: ...

    @abstractmethod
    def ping(self) -> bool: ...

    @abstractmethod
    def server_size(self) -> dict | None:
        """{"used_memory": bytes, "keys": count, "maxmemory": bytes (0: no limit),
        "maxmemory_policy"} of the store; None when not known."""

    def key_proof(self, key_file: str | None = None) -> dict | None:
        """The store's key proof as the signing key configured here (key_file, else
        WARMD_SIGNING_KEY[_FILE]) finds it, as JSON (warmd.store.signing.proof_json); None
        when this store keeps none."""
        return None

    @abstractmethod
    def close(self) -> None: ...
