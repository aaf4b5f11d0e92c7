"""The cache's claims (SharedClaims): single flight per task (leases.Leases), claims on units
of cluster work (leases.WorkClaims), and the order a node tries a plan's tasks in, each
keyed by the adapter's fingerprint. Without a store to share with (disabled, unreachable,
or an adapter that cannot describe itself) every unit is this node's."""

from __future__ import annotations

import contextlib
import time

from warmd.cache.base import CacheAdapter
from warmd.coordination import Claim, ClaimState, WorkKind
from warmd.store import layout
from warmd.store.api import SharedClaims, StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.leases import Leases, WorkClaims, spread_start
from warmd.store.session import Session

ARRIVALS_MS = 3_600_000  # how long a plan's count of arrivals lives after the last one
MAX_ARRIVALS = 10**12  # a count past this (or below 1) was planted: the plan's own order


class StoreClaims(SharedClaims):
    """backend: the store (the main backend: whether it is off, or known to be down)."""

    def __init__(self, session: Session, backend: KeyValueBackend, leases: Leases,
                 work: WorkClaims) -> None:
        self.session, self.backend = session, backend
        self.leases, self.work = leases, work

    def single_flight(self, task_key: str, timeout: float
                      ) -> contextlib.AbstractContextManager[bool]:
        return self.leases.single_flight(task_key, timeout)

    def claim(self, adapter: CacheAdapter, unit: str, kind: WorkKind = WorkKind.ENTRY
              ) -> Claim:
        fp = self.session.digest(adapter)
        if fp is None or self.backend.disabled_reason:
            return Claim(ClaimState.MINE)
        if kind is WorkKind.TASK:
            self.session.task_fp[unit] = fp
        return self.work.claim(fp, unit, kind, self._key_fp(adapter, kind))

    def release(self, adapter: CacheAdapter, unit: str, kind: WorkKind = WorkKind.ENTRY
                ) -> None:
        fp = self.session.digest(adapter)
        if fp is not None:
            self.work.release(fp, unit, kind, self._key_fp(adapter, kind))

    def _key_fp(self, adapter: CacheAdapter, kind: WorkKind) -> str | None:
        return self.session.discovery_digest(adapter) if kind is WorkKind.DISCOVERY else None

    def stop_waiting(self, adapter: CacheAdapter, unit: str, waited: float) -> None:
        fp = self.session.digest(adapter)
        self.session.stats.count("lease_timeouts", fp=fp or "-")
        self.session.warn_once(f"claim-timeout:{fp}", "shared cache: waited %.0f s for %s "
                               "(held by another node); building it here", waited, unit)

    def wait(self, adapter: CacheAdapter, seconds: float) -> None:
        fp = self.session.digest(adapter)
        if fp is None or self.backend.disabled_reason or not self.backend.reachable:
            time.sleep(seconds)
            return
        self.work.wait(fp, seconds)

    def shard_order(self, task_keys: list[str]) -> list[str]:
        """The order in which this node should try a plan's tasks so that N nodes warming the
        same plan start on different tasks: each arrival gets a counter value i (the store's
        atomic increment) and starts at the van der Corput point of i
        (leases.spread_start). Unchanged when the store is down or the count is not one."""
        keys = list(task_keys)
        if len(keys) < 2 or self.session.all_hit(keys):
            return keys  # (every task installed: nothing to spread, nothing to write)
        plan = layout.sha256("\n".join(sorted(keys)).encode())[:16]
        try:
            arrival = self.backend.increment(layout.arrivals_key(plan), ARRIVALS_MS)
        except StoreFailed:
            return keys
        if arrival is None or not 0 < arrival <= MAX_ARRIVALS:  # planted: not a count of ours
            return keys
        start = spread_start(arrival - 1, len(keys))
        return keys[start:] + keys[:start]

    def close(self) -> None:
        """Stop renewing held claims."""
        self.work.close()
