"""The store's counters: this process's totals (`counters`), and the per-node and
per-fingerprint stats kept in Redis (HINCRBYFLOAT), flushed in batches."""

from __future__ import annotations

import threading
import time

from warmd.stats import BY_ID, F, ids
from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.transport import RedisTransport

FLUSH_INTERVAL = 10.0
# Counters warmup reports itself (warmd.stats.Counters via record_outcomes): the store's own
# view of them goes to the per-fingerprint stats only, so a node's totals count nothing twice.
WARMUP_OWNED = frozenset(ids(F.RUN, without=F.STORE))
# Counters only the store can know: what warmup reports under these names is ignored.
STORE_OWNED = frozenset(ids(F.STORE))


class StoreStats:
    def __init__(self, node: str) -> None:
        self.node = node
        self.transport: RedisTransport | None = None  # set once the transport exists
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}
        self._pending_node: dict[str, float] = {}
        self._pending_fp: dict[str, dict[str, float]] = {}
        self._library_fp: dict[str, str] = {}
        self._last_flush = time.monotonic()

    @property
    def counters(self) -> dict[str, float]:
        """This process's store counters so far (a copy)."""
        with self._lock:
            return dict(self._counts)

    def count(self, name: str, value: float = 1, fp: str | None = None) -> None:
        """Count an event of this process, for this node and (given fp) its fingerprint.
        `name` is a counter of warmd.stats.COUNTERS (another name is a bug: ValueError)."""
        if name not in BY_ID:
            raise ValueError(f"{name!r} is not in warmd.stats.COUNTERS")
        if not value:
            return
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + value
            if name not in WARMUP_OWNED:
                _add(self._pending_node, name, value)
            if fp is not None:
                _add(self._pending_fp.setdefault(fp, {}), name, value)

    def count_refusal(self, counter: str, fp: str) -> None:
        """Every refused record or blob is a corrupt_rejected; signature and safety refusals
        are also counted under their own name."""
        self.count("corrupt_rejected", fp=fp)
        if counter != "corrupt_rejected":
            self.count(counter, fp=fp)

    def library_fingerprint(self, library: str, fp: str) -> None:
        """Where record_outcomes' 'LIB.NAME' counters of this library go."""
        self._library_fp[library] = fp

    def record_outcomes(self, counts: dict[str, float]) -> None:
        """Add warmup's counters to this node's stats; a key 'LIB.NAME' (e.g.
        'flashinfer.compiled') goes to that library's fingerprint stats instead."""
        with self._lock:
            for name, value in counts.items():
                if name in STORE_OWNED or not isinstance(value, (int, float)):
                    continue
                library, dot, field = name.partition(".")
                fp = self._library_fp.get(library) if dot else None
                if fp is not None:
                    _add(self._pending_fp.setdefault(fp, {}), field, float(value))
                elif not dot:
                    _add(self._pending_node, name, float(value))
        self.flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush > FLUSH_INTERVAL:
            self.flush()

    def flush(self) -> bool:
        """Push pending counters to Redis; kept for later when the store is unreachable."""
        with self._lock:
            node, fps = self._pending_node, self._pending_fp
            self._pending_node, self._pending_fp = {}, {}
        self._last_flush = time.monotonic()
        if not node and not fps:
            return True

        def run(client):
            pipe = client.pipeline(transaction=False)
            key = layout.node_stats_key(self.node)
            for name, value in node.items():
                pipe.hincrbyfloat(key, name, value)
            pipe.hset(key, "last_seen", time.time())
            pipe.sadd(layout.NODES_KEY, self.node)
            for fp, bucket in fps.items():
                for name, value in bucket.items():
                    pipe.hincrbyfloat(layout.fp_stats_key(fp), name, value)
            return pipe.execute()

        try:
            self.transport.op(run, "stats")
            return True
        except StoreFailed as failed:
            if failed.kind in ("down", "open", "auth"):
                self._restore_pending(node, fps)
            return False

    def _restore_pending(self, node: dict, fps: dict) -> None:
        with self._lock:
            for name, value in node.items():
                _add(self._pending_node, name, value)
            for fp, bucket in fps.items():
                mine = self._pending_fp.setdefault(fp, {})
                for name, value in bucket.items():
                    _add(mine, name, value)


def _add(bucket: dict[str, float], name: str, value: float) -> None:
    bucket[name] = bucket.get(name, 0) + value
