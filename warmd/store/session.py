"""What the parts of one Redis shared cache share: its settings, transport and counters, and
what it learns while running (fingerprints, stale records, whether it may write)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from warmd.cache.base import CacheAdapter
from warmd.store.api import StoreFailed
from warmd.store.fingerprint import Fingerprint, compute_fingerprint
from warmd.store.stats import StoreStats
from warmd.store.transport import RedisTransport
from warmd.targets import Target

log = logging.getLogger("warmd.store")


@dataclass
class Session:
    transport: RedisTransport
    stats: StoreStats
    node: str
    target: Target | None
    signing_key: bytes | None
    ttl_ms: int
    lease_ms: int
    poll_interval: float
    max_artifact_bytes: int
    read_only: bool = False  # learnt from the first write the store's ACL refuses
    stale: dict[str, bytes] = field(default_factory=dict)  # task -> record that did not install
    task_fp: dict[str, str] = field(default_factory=dict)  # task -> fingerprint digest
    _fingerprints: dict[int, tuple[CacheAdapter, Fingerprint]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fingerprint(self, adapter: CacheAdapter) -> Fingerprint:
        """The adapter's fingerprint, computed once (the adapter is kept so its id stays
        unique)."""
        found = self._fingerprints.get(id(adapter))
        if found is None:
            fp = compute_fingerprint(adapter, self.target)
            self._fingerprints[id(adapter)] = (adapter, fp)
            self.stats.library_fingerprint(adapter.library, fp.digest)
            return fp
        return found[1]

    def warn_once(self, key: str, message: str, *args) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)

    def note_read_only(self, failed: StoreFailed) -> None:
        self.read_only = True
        self.warn_once("read_only", "shared cache %s refuses this user's writes (%s): "
                       "reading only, nothing will be published", self.transport.display_url,
                       failed.kind)
