"""The store's counters: this process's totals (`counters`), and the per-node and
per-fingerprint stats kept in the store, flushed in batches.

Each node's and each fingerprint's stats are one value, JSON counter -> number, that a flush
adds to by compare-and-set (warmd.store.backend), so writers on every node add up without a
counter type in the store; the node list `warmd cache stats` reads is one JSON list beside
them. A value that is not counters is replaced by the next flush; a key this interface cannot
read (a key of another Redis type) loses its own counts only.

Counters that cannot be flushed (the store down, paused, full or read-only) are not lost:
at close they are spooled under <state dir>/store-stats/<store id>/ (the store id is a
random value the store keeps at warmd:v1:store-id, learnt on first contact), and the next
process that flushes to the same store adds them (`warmd cache stats` flushes first)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from pathlib import Path

from warmd import boundedjson, settings
from warmd.stats import BY_ID, CounterFlag, ids
from warmd.store import history, json_values, layout
from warmd.store.api import SharedStats, StoreFailed
from warmd.store.backend import KeyValueBackend

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
# Failures of a write the store refused while it answers reads.
_WRITE_REFUSED = ("denied", "readonly", "oom", "error")
MAX_SPOOL_FILES = 1000  # per store: beyond this, the oldest are merged away by the next flush
MAX_BYTES = 1 << 20  # a stats value or the node list, read
_STORE_ID = re.compile(r"^[0-9a-f]{32}$")
# What one flush adds: node -> counters, fingerprint -> counters.
Tally = tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]

log = logging.getLogger("warmd.store")


class StoreStats(SharedStats):
    def __init__(self, node: str, state_dir: Path | None = None) -> None:
        self.node = node
        self.state_dir = state_dir  # where unflushed counters are kept (None: this process's)
        self.backend: KeyValueBackend | None = None  # set once the store's backend exists
        self.history: KeyValueBackend | None = None  # where compile times are (the main one)
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

    def record_compile_times(self, times: dict[str, tuple[int, float]]) -> None:
        """Add (tasks compiled, seconds) per kernel family to the cluster's history."""
        if times and self.history is not None and not self.history.disabled_reason:
            history.write(self.history, times)

    def compile_times(self, families: list[str]) -> dict[str, float]:
        """Mean compile seconds per task of each family with a history (none: {})."""
        if not families or self.history is None or self.history.disabled_reason:
            return {}
        return history.read(self.history, families)

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush > FLUSH_INTERVAL:
            self.flush()

    def flush(self) -> bool:
        """Push pending counters (and counters spooled by earlier processes) to the store;
        kept for later when the store cannot take them."""
        with self._lock:
            node, fps = self._pending_node, self._pending_fp
            self._pending_node, self._pending_fp = {}, {}
        self._last_flush = time.monotonic()
        spooled = self._claim_spool()
        if not node and not fps and not spooled:
            return True
        own: Tally = ({self.node: node}, fps)  # (the node's last_seen, even without counts)
        try:
            self.learn_store_id(create=True)
        except StoreFailed as failed:
            self._unclaim_spool(spooled)
            self._keep(own, failed)
            return False
        if spooled:
            left, failed = self._push(_merged([b for _path, b in spooled]))
            for path, _batch in spooled:
                with contextlib.suppress(OSError):
                    path.unlink()
            if left[0] or left[1]:
                self._spool_tally(left)  # spooled counters stay spooled, whatever failed
            if failed is not None:
                self._keep(own, failed)
                return False
        left, failed = self._push(own)
        if left[0] or left[1]:
            self._keep(left, failed)
        return failed is None

    def _keep(self, tally: Tally, failed: StoreFailed | None) -> None:
        """Own counters the store did not take: pending again when it may take them later
        (failed None: other writers kept winning), else dropped."""
        if failed is None or failed.kind in _KEEP_ON:
            nodes, fps = tally
            self._restore_pending(nodes.get(self.node, {}), fps)

    def _push(self, tally: Tally) -> tuple[Tally, StoreFailed | None]:
        """Add a tally to the store's stats values (and list its nodes): what is left
        undone, and the failure that stopped it (None: none)."""
        nodes, fps = tally
        now = time.time()
        node_keys = {layout.node_stats_key(n): n for n in nodes}
        # this node's own value per fingerprint: no other node ever writes it (a shared one
        # would be compare-and-set by every node of a fleet at once)
        fp_keys = {layout.fp_node_stats_key(fp, self.node): fp
                   for fp, bucket in fps.items() if bucket}
        keys = [*node_keys, *fp_keys, layout.NODES_KEY]
        try:
            raws = dict(zip(keys, self.backend.get_many(keys), strict=True))
        except StoreFailed as failed:
            return tally, failed
        left: Tally = ({}, {})
        failure: StoreFailed | None = None
        for key in keys[:-1]:
            node, fp = node_keys.get(key), fp_keys.get(key)
            counts = {**nodes[node], "last_seen": now} if node is not None else fps[fp]
            done = False
            if failure is None:
                try:
                    done = _add_counts(self.backend, key, raws[key], counts)
                except StoreFailed as failed:
                    failure = failed
            if done:
                continue
            if node is not None:
                if nodes[node]:  # (a node without counts only had its last_seen to say)
                    left[0][node] = nodes[node]
            else:
                left[1][fp] = fps[fp]
        if failure is None:
            with contextlib.suppress(StoreFailed):  # listed at the next flush instead
                _list_nodes(self.backend, raws[layout.NODES_KEY], sorted(nodes))
        return left, failure

    def learn_store_id(self, create: bool = False) -> None:
        """Read (with create, set first on a new store: flushing writes anyway) the store's
        id: where this process's unflushable counters are spooled, and which spooled
        counters it may flush."""
        if self.store_id is not None:
            return
        if create:
            try:
                self.backend.put(layout.STORE_ID_KEY, uuid.uuid4().hex.encode(),
                                 if_absent=True)
            except StoreFailed as failed:
                if failed.kind not in _WRITE_REFUSED:
                    raise
        found = self.backend.get(layout.STORE_ID_KEY)
        if found is not None and _STORE_ID.match(found.decode("latin-1")):
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
        self._spool_tally(({self.node: node} if node else {}, fps))

    def _spool_tally(self, tally: Tally) -> None:
        directory = self._spool_dir()
        if directory is None:
            return
        nodes, fps = tally
        body = json.dumps({"nodes": nodes, "fps": fps}).encode()
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

    def _claim_spool(self) -> list[tuple[Path, Tally]]:
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
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                with contextlib.suppress(OSError):
                    mine.unlink()  # unreadable: nothing to give back
        return claimed

    def _unclaim_spool(self, claimed: list[tuple[Path, Tally]]) -> None:
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


def _spooled_batch(data: dict) -> Tally:
    """A spooled file's counters, checked: names from the table, finite numbers (a file of
    one node, {"node", "counts", "fps"}, as earlier versions wrote, or {"nodes", "fps"})."""
    def numbers(bucket) -> dict[str, float]:
        return {k: float(v) for k, v in bucket.items()
                if k in BY_ID and isinstance(v, (int, float)) and abs(v) < 1e15}

    nodes = data["nodes"] if "nodes" in data else {data["node"]: data["counts"]}
    return ({str(n): numbers(b) for n, b in nodes.items()},
            {str(fp): numbers(b) for fp, b in data["fps"].items()})


def _merged(tallies: list[Tally]) -> Tally:
    nodes: dict[str, dict[str, float]] = {}
    fps: dict[str, dict[str, float]] = {}
    for tally_nodes, tally_fps in tallies:
        for merged, part in ((nodes, tally_nodes), (fps, tally_fps)):
            for name, bucket in part.items():
                mine = merged.setdefault(name, {})
                for counter, value in bucket.items():
                    _add(mine, counter, value)
    return nodes, fps


def read_counts(raw: bytes | None) -> dict[str, float]:
    """The counters a stats value holds (counter -> number; last_seen a unix time); {} for
    none or for a value that is not counters."""
    data = boundedjson.loads_as(raw, dict, MAX_BYTES)
    return {name: float(value) for name, value in data.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


def read_fp_counts(backend: KeyValueBackend, fps: list[str], nodes: list[str]
                   ) -> dict[str, dict[str, float]]:
    """Each fingerprint's counters over the nodes (and what older warmd kept in one value
    for all of them), in one round trip."""
    keys = [(fp, key) for fp in fps for key in
            (layout.fp_stats_key(fp), *(layout.fp_node_stats_key(fp, n) for n in nodes))]
    totals: dict[str, dict[str, float]] = {fp: {} for fp in fps}
    for (fp, _key), raw in zip(keys, backend.get_many([k for _fp, k in keys]), strict=True):
        for name, number in read_counts(raw).items():
            _add(totals[fp], name, number)
    return totals


def read_nodes(raw: bytes | None) -> list[str]:
    """The node names of the node list; [] for none or for a value that is not one."""
    return [n for n in boundedjson.loads_as(raw, list, MAX_BYTES) if isinstance(n, str)]


def _add_counts(backend: KeyValueBackend, key: str, raw: bytes | None,
                counts: dict[str, float]) -> bool:
    """Add counts to the stats value at key (last_seen replaces, the others add), starting
    from raw, what the key held when read; False when other writers kept winning or the
    key holds what this interface cannot read (the counts are then kept for later)."""
    def change(current: bytes | None) -> bytes:
        value = read_counts(current)
        for name, number in counts.items():
            value[name] = number if name == "last_seen" else value.get(name, 0) + number
        return _json(value)

    return json_values.update(backend, key, change, raw=raw)


def _list_nodes(backend: KeyValueBackend, raw: bytes | None, nodes: list[str]) -> None:
    """Add nodes to the node list (raw: what it held when read) where they are missing."""
    def change(current: bytes | None) -> bytes | None:
        listed = read_nodes(current)
        missing = [n for n in nodes if n not in listed]
        return _json(sorted({*listed, *missing})) if missing else current

    json_values.update(backend, layout.NODES_KEY, change, raw=raw)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _add(bucket: dict[str, float], name: str, value: float) -> None:
    bucket[name] = bucket.get(name, 0) + value
