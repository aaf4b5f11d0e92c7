"""Renewing what a plan used: the TTL of the keys that verified (records, manifests,
chunks), its index scores and its fingerprint's, at most once per renew interval per plan
across the cluster (one node wins a marker and renews for all)."""

from __future__ import annotations

import contextlib
import time

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.session import Session

RENEW_MAX_INTERVAL = 86400.0  # seconds: the TTL of what a plan used is renewed this often


class Used:
    """What one prefetch used and verified: the keys whose TTL it may renew, and the entry
    names whose index score it may refresh."""

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
        self.op = session.transport.op

    def renew_interval_ms(self) -> int:
        return int(min(RENEW_MAX_INTERVAL * 1000, max(1000, self.session.ttl_ms // 10)))

    def renew(self, used: Used, tasks: list[str]) -> None:
        """Refresh the TTL of the keys a plan used that verified (records, manifests, chunks),
        its index scores and its fingerprint's: at most once per renew interval for this
        plan across the cluster (the node that sets the plan's marker first renews, the
        others find it set: a read). Best effort: a read-only user may not."""
        if not used.keys:
            return
        plan = layout.sha256("\n".join(sorted(tasks)).encode())[:32]
        marker = layout.renewed_key(used.fp, plan)
        ttl = self.session.ttl_ms
        names, fp = used.names, used.fp

        def claim(client):
            if client.exists(marker):  # (a read: most joins stop here)
                return False
            return client.set(marker, self.session.node, nx=True, px=self.renew_interval_ms())

        def run(client):
            pipe = client.pipeline(transaction=False)
            for key in used.keys:
                pipe.pexpire(key, ttl)
            if names:
                pipe.zadd(layout.index_key(fp), dict.fromkeys(names, time.time()), xx=True)
            pipe.zadd(layout.FPS_KEY, {fp: time.time()})
            pipe.pexpire(layout.fp_meta_key(fp), ttl)
            return pipe.execute(raise_on_error=False)

        with contextlib.suppress(StoreFailed):
            if self.op(claim, "touch"):
                self.op(run, "touch")
