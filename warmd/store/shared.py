"""The shared compiled-kernel cache over any store: SharedCache composed of its parts, each
on the narrow store interface (warmd.store.backend), none knowing which store it is.

    entries.py    fetch: task records and manifests, verified; entries installed
    blobs.py      blobs read in bounded windows (from peers first) and verified
    refusals.py   refused records and entries counted, remembered, quarantined
    renewal.py    the TTL of what a plan used, renewed once per interval cluster-wide
    leases.py     single flight, and claims on units of cluster work
    publish.py    pack and publish a task's entries and record
    counters.py   this process's counters and the per-node / per-fingerprint stats
    session.py    what the parts share (settings, backend, fingerprints, learnt state)
    keyproof.py   whether this node may quarantine, replace and publish (the key proof)

It runs over a StoreBackends (warmd.store.backend): `main` for most parts, the fetching
parts also `replicas` (reads replicas may answer, when the store has them), the leases and
claims `claims` (a claim retried after a timeout that took the lease would find its own and
wait for itself), the counters `stats` (best effort); and its `wakeups`, notices to waiters
sent after the writes (Redis pub/sub, or none: waiters poll). warmd.store.open_shared_cache
builds them from the URL (redis_backend.open_redis, sqlite_backend.open_sqlite).

Every public method degrades instead of raising: a store that is down, slow, out of memory,
read-only or refusing this user's writes turns into misses and skipped publications, counted
in `counters` and in the store's per-node and per-fingerprint stats. Operator commands
(warmd.store.admin) use the operator surface at the end of the class and see StoreFailed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.context import NodeContext
from warmd.coordination import Claim, KernelList, WorkKind
from warmd.store import claimid, formats, history, json_values, layout
from warmd.store.api import BlobPeers, Publication, SharedCache, StoreFailed
from warmd.store.backend import StoreBackends
from warmd.store.blobs import Blobs
from warmd.store.counters import StoreStats
from warmd.store.entries import Entries
from warmd.store.fingerprint import Fingerprint, discovery_digest
from warmd.store.kernel_lists import KernelLists
from warmd.store.leases import KERNEL_LEASE_SECONDS, Leases, WorkClaims, spread_start
from warmd.store.pending import PendingCapture, PendingCaptures
from warmd.store.publish import Publisher
from warmd.store.refusals import Refusals
from warmd.store.session import Session, StaleRecords
from warmd.store.signing import KeyProof
from warmd.store.validation import is_entry_name
from warmd.targets import Target

log = logging.getLogger("warmd.store")
ARRIVALS_MS = 3_600_000  # how long a plan's count of arrivals lives after the last one
# compare-and-set rounds an arrival may lose: nodes joining together arrive together
ARRIVAL_TRIES = 64


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
        self.entries = Entries(self.session, stale, self.refusals, self.blobs, self.backend,
                               store.replicas)
        self.leases = Leases(self.session, store.claims, stale, self.wakeups)
        self.publisher = Publisher(self.session, stale, self.backend)
        self.work_claims = WorkClaims(self.session, store.claims, stale, self.wakeups,
                                      _lease_ms(kernel_lease_seconds))
        self.captures = PendingCaptures(self.session, self.backend)
        self.kernel_lists = KernelLists(self.session, self.backend, self.stats)
        self.embedded = embedded  # the embedded server this cache uses, if any

    # -- SharedCache -------------------------------------------------------------------------

    def fetch_task(self, adapter: CacheAdapter, task_key: str) -> list[str] | None:
        return self.entries.prefetch(adapter, [task_key]).get(task_key)

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        return self.entries.prefetch(adapter, task_keys)

    def installed_seconds(self, library: str, name: str) -> float | None:
        return self.entries.installed.get((library, name))

    def single_flight(self, task_key: str, timeout: float
                      ) -> contextlib.AbstractContextManager[bool]:
        return self.leases.single_flight(task_key, timeout)

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> Publication:
        publication = self.publisher.publish_task(adapter, task_key, entries, compile_seconds)
        fp = self._fp(adapter)
        if publication.skipped is None and fp is not None:
            # wake the nodes waiting on the task (best effort: they wait a bounded time)
            self.wakeups.notify({layout.channel(fp, task_key): b"published"})
        return publication

    def add_learned(self, adapter: CacheAdapter, plan_key: str, names: list[str]) -> bool:
        if not names or self.session.read_only:
            return False
        try:
            key = layout.learned_key(self.session.fingerprint(adapter).digest, plan_key)
        except Exception:  # the adapter could not describe itself: nothing was published
            return False
        try:  # the newest stay
            return json_values.add_names(self.backend, key, dict.fromkeys(names, time.time()),
                                         layout.MAX_LEARNED, self.session.ttl_ms)
        except StoreFailed:
            return False

    def learned(self, adapter: CacheAdapter, plan_key: str) -> list[str]:
        """The newest layout.MAX_LEARNED names of the plan's learned index (names dated in
        the future are not newest: left out), valid names only; what is left out is
        counted (learned_cut): whatever a writer adds, a node reads a bounded list."""
        try:
            fp = self.session.fingerprint(adapter).digest
        except Exception:
            return []
        key = layout.learned_key(fp, plan_key)
        try:
            index = json_values.read_index(self.backend.get(key))
        except StoreFailed:
            return []
        newest, total = json_values.newest(index, time.time() + layout.LEARNED_CLOCK_SKEW,
                                           layout.MAX_LEARNED)
        cut = total - len(newest)
        if cut > 0:
            self.stats.count("learned_cut", cut, fp)
            self.session.warn_once(f"learned:{key}", "shared cache: the learned index of plan "
                                   "%s (%s) holds %d names; reading the newest %d",
                                   plan_key, adapter.library, total, len(newest))
        return [n for n in newest if is_entry_name(n)]

    def submit_capture(self, adapter: CacheAdapter, plans: list[str], name: str,
                     artifact: bytes, compile_seconds: float = 0.0) -> bool:
        return self.captures.submit(adapter, plans, name, artifact, compile_seconds)

    def pending_captures(self, adapter: CacheAdapter) -> list[str]:
        return self.captures.names(adapter)

    def read_capture(self, adapter: CacheAdapter, name: str
                   ) -> tuple[PendingCapture, bytes] | None:
        return self.captures.read(adapter, name)

    def drop_capture(self, adapter: CacheAdapter, name: str, chunks: int = 0) -> bool:
        return self.captures.drop(adapter, name, chunks)

    def shard_order(self, task_keys: list[str]) -> list[str]:
        """The order in which this node should try a plan's tasks so that N nodes warming the
        same plan start on different tasks: each arrival gets a counter value i (added to
        by compare-and-set, json_values.count_up) and starts at the van der Corput point of
        i (leases.spread_start). Unchanged when the store is down or the count is lost."""
        keys = list(task_keys)
        if len(keys) < 2 or self.session.all_hit(keys):
            return keys  # (every task installed: nothing to spread, nothing to write)
        plan = layout.sha256("\n".join(sorted(keys)).encode())[:16]
        try:
            arrival = json_values.count_up(self.backend, layout.arrivals_key(plan),
                                           ARRIVALS_MS, ARRIVAL_TRIES)
        except StoreFailed:
            return keys
        if arrival is None:  # (lost to other arrivals every time, or not a count's key)
            return keys
        start = spread_start(arrival - 1, len(keys))
        return keys[start:] + keys[:start]

    # -- cluster work ------------------------------------------------------------------------

    def _fp(self, adapter: CacheAdapter) -> str | None:
        try:
            return self.session.fingerprint(adapter).digest
        except Exception:  # the adapter could not describe itself: nothing is shared
            return None

    def _discovery_fp(self, adapter: CacheAdapter) -> str | None:
        try:
            return discovery_digest(self.session.fingerprint(adapter))
        except Exception:  # the adapter could not describe itself: nothing is shared
            return None

    def claim_work(self, adapter: CacheAdapter, unit: str,
                   kind: WorkKind = WorkKind.ENTRY) -> Claim:
        fp = self._fp(adapter)
        if fp is None or self.backend.disabled_reason:
            return super().claim_work(adapter, unit, kind)
        if kind is WorkKind.TASK:
            self.session.task_fp[unit] = fp
        return self.work_claims.claim(fp, unit, kind, self._key_fp(adapter, kind))

    def release_work(self, adapter: CacheAdapter, unit: str,
                     kind: WorkKind = WorkKind.ENTRY) -> None:
        fp = self._fp(adapter)
        if fp is not None:
            self.work_claims.release(fp, unit, kind, self._key_fp(adapter, kind))

    def _key_fp(self, adapter: CacheAdapter, kind: WorkKind) -> str | None:
        return self._discovery_fp(adapter) if kind is WorkKind.DISCOVERY else None

    def stop_waiting(self, adapter: CacheAdapter, unit: str, waited: float) -> None:
        fp = self._fp(adapter)
        self.stats.count("lease_timeouts", fp=fp or "-")
        self.session.warn_once(f"claim-timeout:{fp}", "shared cache: waited %.0f s for %s "
                               "(held by another node); building it here", waited, unit)

    def wait_for_claims(self, adapter: CacheAdapter, seconds: float) -> None:
        fp = self._fp(adapter)
        if fp is None or self.backend.disabled_reason or not self.reachable:
            time.sleep(seconds)
            return
        self.work_claims.wait(fp, seconds)

    def publish_entries(self, adapter: CacheAdapter, entries: list[CacheEntry],
                        compile_seconds: float) -> Publication:
        return self.publisher.publish_entries(adapter, entries, compile_seconds)

    def install_entries(self, adapter: CacheAdapter, names: list[str]) -> list[str]:
        try:
            fp = self.session.fingerprint(adapter)
            present = {e.name for e in adapter.list_entries()}
            wanted = sorted(set(names) - present)
            installed = self.entries.install_named(adapter, fp, wanted) if wanted else set()
        except StoreFailed:
            return []
        except Exception as exc:  # a bug or an unforeseen value: a miss, never a failure
            self.stats.count("fetch_failed")
            log.warning("shared cache: installing %s entries failed (%s: %s)",
                        adapter.library, type(exc).__name__, exc)
            return []
        return sorted((set(names) & present) | installed)

    def kernel_list(self, adapter: CacheAdapter, tasks: list[str]) -> KernelList:
        return self.kernel_lists.read(self._discovery_fp(adapter), self._fp(adapter), tasks)

    def publish_kernel_list(self, adapter: CacheAdapter, digest: str,
                            tasks: dict[str, list[str]], jobs: dict[str, dict],
                            also: dict[str, list[str]] | None = None) -> bool:
        fp, list_fp = self._fp(adapter), self._discovery_fp(adapter)
        if fp is None or list_fp is None or self.session.read_only \
                or self.backend.disabled_reason:
            return False
        if not self.kernel_lists.publish(list_fp, digest, tasks, jobs, also or {}):
            return False
        # wake the nodes waiting on fp's claims (best effort: they wait a bounded time)
        self.wakeups.notify({layout.kernel_channel(fp): b"kernel list"})
        return True

    def record_outcomes(self, counts: dict[str, float]) -> None:
        self.stats.record_outcomes(counts)

    def record_compile_times(self, times: dict[str, tuple[int, float]]) -> None:
        if times and not self.backend.disabled_reason:
            history.write(self.backend, times)

    def compile_times(self, families: list[str]) -> dict[str, float]:
        if not families or self.backend.disabled_reason:
            return {}
        return history.read(self.backend, families)

    @property
    def counters(self) -> dict[str, float]:
        return self.stats.counters

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
        self.work_claims.close()
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
