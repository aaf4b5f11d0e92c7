"""The shared compiled-kernel cache over any store: SharedCache composed of its parts, each
on the narrow store interface (warmd.store.backend), none knowing which store it is.

    entries.py    `entries`: fetch (task records and manifests, verified; entries
                  installed) and publish (through publish.py)
    blobs.py      blobs read in bounded windows (from peers first) and verified
    refusals.py   refused records and entries counted, remembered, quarantined
    renewal.py    the TTL of what a plan used, renewed once per interval cluster-wide
    claims.py     `claims`: single flight, claims on cluster work, shard order
    leases.py     the leases and claims under them
    kernel_lists.py  `lists`: kernel lists and learned indexes
    pending.py    `captures`: the pending tier
    publish.py    pack and publish a task's entries and record
    counters.py   `stats`: this process's counters and the per-node / per-fingerprint
                  stats, and the compile-time history
    session.py    what the parts share (settings, backend, fingerprints, learnt state)
    keyproof.py   whether this node may quarantine, replace and publish (the key proof)

It runs over a StoreBackends (warmd.store.backend): `main` for most parts, the fetching
parts also `replicas` (reads replicas may answer, when the store has them), the leases and
claims `claims` (a claim retried after a timeout that took the lease would find its own and
wait for itself), the counters `stats` (best effort); and its `wakeups`, notices to waiters
sent after the writes (Redis pub/sub, or none: waiters poll). warmd.store.open_shared_cache
builds them from the URL (redis_backend.open_redis, sqlite_backend.open_sqlite).

Every method of the parts and of the cache degrades instead of raising: a store that is down,
slow, out of memory, read-only or refusing this user's writes turns into misses and skipped
publications, counted in `stats.counters` and in the store's per-node and per-fingerprint
stats. Operator commands
(warmd.store.admin) use the operator surface at the end of the class and see StoreFailed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from warmd.cache.base import CacheAdapter
from warmd.context import NodeContext
from warmd.store import claimid, formats
from warmd.store.api import BlobPeers, SharedCache, StoreFailed
from warmd.store.backend import StoreBackends
from warmd.store.blobs import Blobs
from warmd.store.claims import StoreClaims
from warmd.store.counters import StoreStats
from warmd.store.entries import Entries
from warmd.store.fingerprint import Fingerprint
from warmd.store.kernel_lists import KernelLists
from warmd.store.leases import KERNEL_LEASE_SECONDS, Leases, WorkClaims
from warmd.store.pending import PendingCaptures
from warmd.store.publish import Publisher
from warmd.store.refusals import Refusals
from warmd.store.session import Session, StaleRecords
from warmd.store.signing import KeyProof
from warmd.targets import Target

log = logging.getLogger("warmd.store")


def _lease_ms(seconds: float) -> int:
    """A claim's TTL, never longer than any warmd honours (claimid.MAX_CLAIM_TTL_MS)."""
    return max(1, min(int(seconds * 1000), claimid.MAX_CLAIM_TTL_MS))


class StoreSharedCache(SharedCache):
    """SharedCache over a store (StoreBackends); a store that is disabled (NoStore) gives a
    cache whose every call is a miss and that says why in `disabled_reason`. `stats` counts
    for the node it names (the store's failures count there too)."""

    def __init__(self, store: StoreBackends, stats: StoreStats, *,
                 target: Target | None = None, signing_key: bytes | None = None,
                 ttl_seconds: int | None = None, lease_seconds: float = 30.0,
                 poll_interval: float = 0.5, max_artifact_bytes: int | None = None,
                 embedded: Any = None, peers: BlobPeers | None = None,
                 kernel_lease_seconds: float = KERNEL_LEASE_SECONDS,
                 context: NodeContext | None = None) -> None:
        # the node's settings (default: this process's environment); an argument wins
        store_settings = (context or NodeContext.of()).store
        self.stats = stats
        self.stats.backend = store.stats  # never retried
        self.stats.history = store.main  # compile times live with the entries
        self.backend = store.main
        self.session = Session(
            self.backend, self.stats, stats.node, target, signing_key,
            ttl_ms=int((ttl_seconds or store_settings.ttl_seconds) * 1000),
            lease_ms=_lease_ms(lease_seconds), poll_interval=poll_interval,
            max_artifact_bytes=max_artifact_bytes or store_settings.max_artifact_bytes,
            namespace=store_settings.namespace)
        stale = StaleRecords()  # Entries notes them, Leases reads them, Publisher clears them
        self.wakeups = store.wakeups  # notices to waiters, beside the backend
        self.refusals = Refusals(self.session, self.backend)
        self.blobs = Blobs(self.session, self.backend, store.replicas, peers)
        self.publisher = Publisher(self.session, stale, self.backend)
        self.entries = Entries(self.session, stale, self.refusals, self.blobs, self.backend,
                               self.publisher, self.wakeups, store.replicas)
        self.claims = StoreClaims(
            self.session, self.backend, Leases(self.session, store.claims, stale, self.wakeups),
            WorkClaims(self.session, store.claims, stale, self.wakeups,
                       _lease_ms(kernel_lease_seconds)))
        self.lists = KernelLists(self.session, self.backend, self.stats, self.wakeups)
        self.captures = PendingCaptures(self.session, self.backend)
        self.embedded = embedded  # the embedded server this cache uses, if any

    # -- health and identity -------------------------------------------------------------

    @property
    def display_url(self) -> str:
        return self.backend.display_url

    @property
    def disabled_reason(self) -> str | None:
        return self.backend.disabled_reason

    @property
    def last_error(self) -> str | None:
        return self.backend.last_error

    def ping(self) -> bool:
        if not self.backend.ping():
            return False
        with contextlib.suppress(StoreFailed):
            self.stats.learn_store_id()  # where counters it cannot flush will wait
        self.session.key_state()  # read (kept recently used) and, when missing, re-asserted
        return True

    @property
    def key_proof(self) -> KeyProof:
        """The store's key proof as this node finds it (warmd.store.keyproof)."""
        if self.backend.disabled_reason:
            return KeyProof.UNKNOWN
        return self.session.key_state()

    @property
    def reachable(self) -> bool:
        return self.backend.reachable

    def close(self) -> None:
        self.claims.close()
        self.wakeups.close()
        if not self.stats.flush():
            self.stats.spool()  # kept locally for the next process that reaches the store
        self.backend.close()

    # -- beyond SharedCache ------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """Whether the store refused this user's writes (then nothing is published)."""
        return self.session.read_only

    def fingerprint(self, adapter: CacheAdapter) -> Fingerprint:
        return self.session.fingerprint(adapter)

    # -- the operator surface (warmd.store.admin): store errors raise StoreFailed ------------

    def op(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(client) on a Redis store's client (timeouts, breaker, classification); on
        another store it raises StoreFailed saying it needs Redis (KeyValueBackend.client_op)."""
        return self.backend.client_op(fn, what)

    def accept_manifest(self, raw: bytes, fp: str, name: str) -> formats.Manifest:
        """The manifest stored for (fp, name) if a fetch here would use it (this node's
        signing key and size limit); raises BadRecord or one of its kinds."""
        return formats.accept_manifest(raw, key=self.session.signing_key,
                                       max_size=self.session.max_artifact_bytes, fp=fp,
                                       name=name)

    def accept_record(self, raw: bytes, fp: str, task: str) -> formats.StoredTaskRecord:
        return formats.accept_record(raw, key=self.session.signing_key, fp=fp, task=task)

    @property
    def ttl_ms(self) -> int:
        """How long a stored key lives after its last use."""
        return self.session.ttl_ms

    @property
    def max_artifact_bytes(self) -> int:
        return self.session.max_artifact_bytes
