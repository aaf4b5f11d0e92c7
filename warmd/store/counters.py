"""The store's counters: this process's totals (`counters`), and the per-node and
per-fingerprint stats kept in Redis (HINCRBYFLOAT), flushed in batches.

Counters that cannot be flushed (the store down, paused, full or read-only) are not lost:
at close they are spooled under <state dir>/store-stats/<store id>/ (the store id is a
random value the store keeps at warmd:v1:store-id, learnt on first contact), and the next
process that flushes to the same store adds them (`warmd cache stats` flushes first)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path

from warmd import settings
from warmd.stats import BY_ID, CounterFlag, ids
from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.transport import RedisTransport

FLUSH_INTERVAL = 10.0
# Counters warmup reports itself (warmd.stats.Counters via record_outcomes): the store's own
# view of them goes to the per-fingerprint stats only, so a node's totals count nothing twice.
WARMUP_OWNED = frozenset(ids(CounterFlag.RUN, without=CounterFlag.STORE))
# Counters only the store can know: what warmup reports under these names is ignored.
STORE_OWNED = frozenset(ids(CounterFlag.STORE))
# Fewer writes per join: time spent is kept per node (the per-fingerprint stats keep the
# saved compile time `warmd cache stats` shows), task lookups per fingerprint (a node has its
# `tasks`).
FP_DROPPED = frozenset(set(ids(CounterFlag.TIME)) - set(ids(CounterFlag.FP_COLUMN)))
NODE_DROPPED = frozenset({"tasks_hit", "tasks_missed"})
# Failures after which pending counters are kept (the store may take them later); a user the
# ACL refuses ("denied") never will.
_KEEP_ON = ("down", "open", "auth", "oom", "readonly")
MAX_SPOOL_FILES = 1000  # per store: beyond this, the oldest are merged away by the next flush
_STORE_ID = re.compile(r"^[0-9a-f]{32}$")

log = logging.getLogger("warmd.store")


class StoreStats:
    def __init__(self, node: str, state_dir: Path | None = None) -> None:
        self.node = node
        self.state_dir = state_dir  # where unflushed counters are kept (None: this process's)
        self.transport: RedisTransport | None = None  # set once the transport exists
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}
        self._pending_node: dict[str, float] = {}
        self._pending_fp: dict[str, dict[str, float]] = {}
        self._library_fp: dict[str, str] = {}
        self._last_flush = time.monotonic()
        self.store_id: str | None = None  # learnt on first contact (learn_store_id)

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
            if name not in WARMUP_OWNED and name not in NODE_DROPPED:
                _add(self._pending_node, name, value)
            if fp is not None and name not in FP_DROPPED:
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
                if name in STORE_OWNED or not isinstance(value, (int, float)) or not value:
                    continue  # (a zero adds nothing: not a write)
                library, dot, field = name.partition(".")
                fp = self._library_fp.get(library) if dot else None
                if fp is not None and field not in FP_DROPPED:
                    _add(self._pending_fp.setdefault(fp, {}), field, float(value))
                elif not dot:
                    _add(self._pending_node, name, float(value))
        self.flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush > FLUSH_INTERVAL:
            self.flush()

    def flush(self) -> bool:
        """Push pending counters (and counters spooled by earlier processes) to Redis; kept
        for later when the store cannot take them."""
        with self._lock:
            node, fps = self._pending_node, self._pending_fp
            self._pending_node, self._pending_fp = {}, {}
        self._last_flush = time.monotonic()
        spooled = self._claim_spool()
        if not node and not fps and not spooled:
            return True
        batches = [(self.node, node, fps), *((b["node"], b["counts"], b["fps"])
                                             for _path, b in spooled)]

        def run(client):
            self.learn_store_id(client, create=True)
            pipe = client.pipeline(transaction=False)
            for name_of_node, counts, fp_counts in batches:
                _queue(pipe, name_of_node, counts, fp_counts)
            replies = pipe.execute(raise_on_error=False)
            # a stats key of another Redis type (WRONGTYPE) loses its own counts only
            for reply in replies:
                if isinstance(reply, Exception) and not _wrong_type(reply):
                    raise reply
            new = [name for name, reply in zip(_first_seen(batches), replies, strict=True)
                   if name and reply and not isinstance(reply, Exception)]
            if new:  # a node's first counters: list it (once, not at every flush)
                listed = client.pipeline(transaction=False).sadd(layout.NODES_KEY, *new)
                for reply in listed.execute(raise_on_error=False):
                    if isinstance(reply, Exception) and not _wrong_type(reply):
                        raise reply
            return replies

        try:
            self.transport.op(run, "stats")
        except StoreFailed as failed:
            self._unclaim_spool(spooled)
            if failed.kind in _KEEP_ON:
                self._restore_pending(node, fps)
            return False
        for path, _batch in spooled:
            with contextlib.suppress(OSError):
                path.unlink()
        return True

    def learn_store_id(self, client, create: bool = False) -> None:
        """Read (with create, set first on a new store: flushing writes anyway) the store's
        id: where this process's unflushable counters are spooled, and which spooled
        counters it may flush."""
        if self.store_id is not None:
            return
        pipe = client.pipeline(transaction=False)
        if create:
            pipe.set(layout.STORE_ID_KEY, uuid.uuid4().hex, nx=True)
        pipe.get(layout.STORE_ID_KEY)
        found = pipe.execute(raise_on_error=False)[-1]
        if isinstance(found, bytes) and _STORE_ID.match(found.decode("latin-1")):
            self.store_id = found.decode()

    def spool(self) -> None:
        """Write what is still pending (the store could not take it) to the local spool,
        for the next process that reaches the same store; called at close."""
        with self._lock:
            node, fps = self._pending_node, self._pending_fp
            self._pending_node, self._pending_fp = {}, {}
        directory = self._spool_dir()
        if directory is None or not (node or fps):
            return
        body = json.dumps({"node": self.node, "counts": node, "fps": fps}).encode()
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{name}"
            tmp.write_bytes(body)
            tmp.replace(directory / name)
        except OSError as exc:
            log.warning("shared cache: cannot keep unflushed counters in %s: %s", directory,
                        exc)

    def _spool_dir(self) -> Path | None:
        if self.store_id is None:
            return None
        return (self.state_dir or settings.state_dir()) / "store-stats" / self.store_id

    def _claim_spool(self) -> list[tuple[Path, dict]]:
        """Spooled counter files of this store, each renamed to be this process's alone."""
        directory = self._spool_dir()
        if directory is None or not directory.is_dir():
            return []
        claimed = []
        for path in sorted(directory.glob("*.json"))[:MAX_SPOOL_FILES]:
            mine = path.with_name(f".claimed-{os.getpid()}-{path.name}")
            try:
                path.rename(mine)
                batch = json.loads(mine.read_text())
                claimed.append((mine, _spooled_batch(batch)))
            except (OSError, ValueError, TypeError):
                with contextlib.suppress(OSError):
                    mine.unlink()  # unreadable: nothing to give back
        return claimed

    def _unclaim_spool(self, claimed: list[tuple[Path, dict]]) -> None:
        for path, _batch in claimed:
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name.split("-", 2)[2]))

    def _restore_pending(self, node: dict, fps: dict) -> None:
        with self._lock:
            for name, value in node.items():
                _add(self._pending_node, name, value)
            for fp, bucket in fps.items():
                mine = self._pending_fp.setdefault(fp, {})
                for name, value in bucket.items():
                    _add(mine, name, value)


def _queue(pipe, node: str, counts: dict[str, float], fps: dict[str, dict[str, float]]
           ) -> None:
    key = layout.node_stats_key(node)
    for name, value in counts.items():
        pipe.hincrbyfloat(key, name, value)
    pipe.hset(key, "last_seen", time.time())  # 1: the field is new, the node too
    for fp, bucket in fps.items():
        for name, value in bucket.items():
            pipe.hincrbyfloat(layout.fp_stats_key(fp), name, value)


def _wrong_type(reply: Exception) -> bool:
    return str(reply).startswith("WRONGTYPE")


def _first_seen(batches: list[tuple[str, dict, dict]]) -> list[str | None]:
    """Per command _queue pipelines for batches: the node's name at its HSET of last_seen
    (whose reply says whether the node is new), None elsewhere."""
    out: list[str | None] = []
    for node, counts, fps in batches:
        out += [None] * len(counts) + [node]
        out += [None] * sum(len(bucket) for bucket in fps.values())
    return out


def _spooled_batch(data: dict) -> dict:
    """A spooled file's counters, checked: names from the table, finite numbers."""
    def numbers(bucket) -> dict[str, float]:
        return {k: float(v) for k, v in bucket.items()
                if k in BY_ID and isinstance(v, (int, float)) and abs(v) < 1e15}

    fps = data["fps"]
    return {"node": str(data["node"]), "counts": numbers(data["counts"]),
            "fps": {str(fp): numbers(b) for fp, b in fps.items()}}


def _add(bucket: dict[str, float], name: str, value: float) -> None:
    bucket[name] = bucket.get(name, 0) + value
