"""What the parts of one shared cache share: its settings, backend and counters, and what
it learns while running (fingerprints, whether it may write); and the stale task
records, which pass from the fetching part to the leasing part to the publishing one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from warmd.cache.base import CacheAdapter
from warmd.store.api import StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.counters import StoreStats
from warmd.store.fingerprint import Fingerprint, compute_fingerprint, discovery_digest
from warmd.store.keyproof import ClusterKey
from warmd.store.signing import KeyProof
from warmd.targets import Target

log = logging.getLogger("warmd.store")


class StaleRecords:
    """Task records a fetch found but could not use (refused, or naming entries that did not
    install): the store holds a record, yet the task is not published for this node.

    Entries writes them (`note`), Leases reads them (`of`: a claim treats exactly those
    bytes as "not published", so the lease is still taken) and Publisher clears them
    (`clear`) once its own record replaced them. Each part is handed this object."""

    def __init__(self) -> None:
        self._by_task: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def note(self, task: str, raw: bytes) -> None:
        with self._lock:
            self._by_task[task] = raw

    def of(self, task: str) -> bytes:
        """The stale record's bytes (b"": none)."""
        with self._lock:
            return self._by_task.get(task, b"")

    def clear(self, task: str) -> None:
        with self._lock:
            self._by_task.pop(task, None)


@dataclass
class Session:
    backend: KeyValueBackend  # the store (warmd.store.backend), and how it is
    stats: StoreStats
    node: str
    target: Target | None
    signing_key: bytes | None
    ttl_ms: int
    lease_ms: int
    poll_interval: float
    max_artifact_bytes: int
    namespace: str  # the salt of every fingerprint
    read_only: bool = False  # learnt from the first write the store's ACL refuses
    task_fp: dict[str, str] = field(default_factory=dict)  # task -> fingerprint digest
    # What this process counted already, so a fetch repeated per task counts nothing twice:
    # (fp, entry) counted as a hit, (fp, task) -> the task outcome counted.
    hits_counted: set[tuple[str, str]] = field(default_factory=set)
    tasks_counted: dict[tuple[str, str], str] = field(default_factory=dict)
    # (fp, entry, digest) -> why this node cannot use it: never fetched again by this process
    refused_entries: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # ...of which those whose build does not work here: this node's publish replaces them
    incompatible_here: set[tuple[str, str, str]] = field(default_factory=set)
    _fingerprints: dict[int, tuple[CacheAdapter, Fingerprint]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.cluster_key = ClusterKey(self.backend, self.signing_key, self.warn_once,
                                      self.backend.display_url)

    def fingerprint(self, adapter: CacheAdapter) -> Fingerprint:
        """The adapter's fingerprint, computed once (the adapter is kept so its id stays
        unique)."""
        found = self._fingerprints.get(id(adapter))
        if found is None:
            fp = compute_fingerprint(adapter, self.target, self.namespace)
            self._fingerprints[id(adapter)] = (adapter, fp)
            self.stats.library_fingerprint(adapter.library, fp.digest)
            return fp
        return found[1]

    def digest(self, adapter: CacheAdapter) -> str | None:
        """The adapter's fingerprint digest; None when it could not describe itself (then
        nothing of it is shared)."""
        try:
            return self.fingerprint(adapter).digest
        except Exception:  # the adapter could not describe itself: nothing is shared
            return None

    def discovery_digest(self, adapter: CacheAdapter) -> str | None:
        """The digest kernel lists live under (warmd.store.fingerprint.discovery_digest);
        None when the adapter could not describe itself."""
        try:
            return discovery_digest(self.fingerprint(adapter))
        except Exception:  # the adapter could not describe itself: nothing is shared
            return None

    def first_hits(self, fp: str, names: Iterable[str]) -> list[str]:
        """The names not counted as hits by this process before (now they are)."""
        with self._lock:
            new = [n for n in names if (fp, n) not in self.hits_counted]
            self.hits_counted.update((fp, n) for n in new)
        return new

    def first_task_outcome(self, fp: str, task: str, outcome: str) -> bool:
        """Whether to count a task's outcome (tasks_hit / tasks_missed): once per task and
        outcome, and no miss after a hit (a hit after a miss, when another node published
        meanwhile, does count)."""
        with self._lock:
            before = self.tasks_counted.get((fp, task))
            if before in (outcome, "tasks_hit"):
                return False
            self.tasks_counted[(fp, task)] = outcome
        return True

    def all_hit(self, tasks: list[str]) -> bool:
        """Whether this process found every one of these tasks complete in the store."""
        with self._lock:
            return all(self.tasks_counted.get((self.task_fp.get(t, ""), t)) == "tasks_hit"
                       for t in tasks)

    def warn_once(self, key: str, message: str, *args) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)

    def note_read_only(self, failed: StoreFailed) -> None:
        self.read_only = True
        self.warn_once("read_only", "shared cache %s refuses this user's writes (%s): "
                       "reading only, nothing will be published", self.backend.display_url,
                       failed.kind)

    def holds_cluster_key(self) -> bool:
        """Whether this node may quarantine, replace and publish now: the store's key proof
        is its own key's (a missing one claimed first, when nothing says another key is the
        cluster's), or it has no key and the store no proof (warmd.store.keyproof)."""
        return self.key_state().authority

    def key_state(self) -> KeyProof:
        return self.cluster_key.state()
