"""Renewing what a plan used: the TTL of the keys that verified (records, manifests,
chunks) and of its fingerprint's inputs, and its entries' last use (their used keys, the
fingerprint's index), at most once per renew interval per plan across the cluster (one node
wins a marker and renews for all). Through the narrow store interface
(warmd.store.backend): this module knows no Redis."""

from __future__ import annotations

import contextlib
import time

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.backend import Put
from warmd.store.session import Session

RENEW_MAX_INTERVAL = 86400.0  # seconds: the TTL of what a plan used is renewed this often


class Used:
    """What one prefetch used and verified: the keys whose TTL it may renew, and the entry
    names whose last use it may refresh."""

    def __init__(self, fp: str) -> None:
        self.fp = fp
        self.keys: list[str] = []
        self.names: list[str] = []

    def add_manifests(self, manifests: dict[str, tuple]) -> None:
        self.names += list(manifests)
        self.keys += [layout.manifest_key(self.fp, name) for name in manifests]


class Renewal:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.backend = session.backend

    def renew_interval_ms(self) -> int:
        return int(min(RENEW_MAX_INTERVAL * 1000, max(1000, self.session.ttl_ms // 10)))

    def renew(self, used: Used, tasks: list[str]) -> None:
        """Refresh the TTL of the keys a plan used that verified (records, manifests, chunks),
        its entries' last use and its fingerprint's inputs' TTL: at most once per renew
        interval for this plan across the cluster (the node that sets the plan's marker
        first renews, the others find it set: a read). Best effort: a read-only user may
        not, and a store failure stops it."""
        if not used.keys:
            return
        plan = layout.sha256("\n".join(sorted(tasks)).encode())[:32]
        with contextlib.suppress(StoreFailed):
            if self._won(layout.renewed_key(used.fp, plan)):
                self._touch(used)

    def _won(self, marker: str) -> bool:
        """Whether this node renews now: nobody set the marker (a read: most joins stop
        here), and this node set it first."""
        if self.backend.get(marker) is not None:
            return False
        return self.backend.put(marker, self.session.node.encode(), self.renew_interval_ms(),
                                if_absent=True)

    def _touch(self, used: Used) -> None:
        """Every key's TTL renewed, and the time now put at each used key that is there
        (the index is refreshed, never added to; of its values one byte is read, whatever
        size a writer gave them; one that reads as nothing, a planted key of another type
        say, is left to the next publication's put): three round trips, whatever the
        number of keys."""
        self.backend.expire_many([*used.keys, layout.fp_meta_key(used.fp)],
                                 self.session.ttl_ms)
        used_keys = [layout.used_key(used.fp, name) for name in used.names]
        there = self.backend.get_prefixes([(key, 1) for key in used_keys])
        now = f"{time.time():.3f}".encode()
        self.backend.put_many([Put(key, now) for key, found in zip(used_keys, there,
                                                                   strict=True) if found])
