"""The shared compiled-kernel cache over Redis: fetch and verify, single-flight, publish, stats.

Every public method degrades instead of raising: a store that is down, slow, out of memory,
read-only or refusing this user's writes turns into misses and skipped publications, counted
in `counters` and in the store's per-node and per-fingerprint stats.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from warmd import settings
from warmd.cache.base import CacheAdapter, CacheEntry, IncompatibleHere, UnsafeArtifact
from warmd.store import layout
from warmd.store.api import SharedCache, StoreFailed
from warmd.store.breaker import CircuitBreaker
from warmd.store.connection import (
    CONNECT_TIMEOUT,
    STORE_ERRORS,
    StoreURL,
    classify,
    make_client,
    scrub,
)
from warmd.store.fingerprint import Fingerprint, compute_fingerprint
from warmd.store.layout import BadRecord, Manifest, TaskRecord
from warmd.store.signing import check as check_signature
from warmd.store.signing import sign
from warmd.targets import Target

log = logging.getLogger("warmd.store")

QUARANTINE_TTL_MS = 7 * 86400 * 1000
BLOB_BATCH_BYTES = 64 << 20  # bound on blob bytes held in memory during a prefetch
INSTALL_THREADS = 8
FLUSH_INTERVAL = 10.0
# Counters warmup reports itself (warmd.stats.Counters via record_outcomes): the store's own
# view of them goes to the per-fingerprint stats only, so a node's totals count nothing twice.
WARMUP_OWNED = ("local_hits", "remote_hits", "compile_seconds", "compile_seconds_saved")
# Counters only the store can know: what warmup reports under these names is ignored.
STORE_OWNED = ("corrupt_rejected", "signature_rejected", "unsafe_rejected", "refused_here",
               "bytes_fetched", "bytes_published")

_CLAIM = """
local rec = redis.call('GET', KEYS[1])
if rec and rec ~= ARGV[3] then return {2, ''} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, ''} end
return {0, redis.call('GET', KEYS[2]) or ''}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_QUARANTINE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[4])
return 1
"""


class RedisSharedCache(SharedCache):
    """SharedCache over one Redis (or Redis Cluster) URL; url=None gives a disabled cache
    (every call a miss) that says why in `disabled_reason`."""

    def __init__(self, store_url: StoreURL | None, *, target: Target | None = None,
                 signing_key: bytes | None = None, node: str | None = None,
                 ttl_seconds: int | None = None, connect_timeout: float = CONNECT_TIMEOUT,
                 socket_timeout: float | None = None, lease_seconds: float = 30.0,
                 poll_interval: float = 0.5, max_artifact_bytes: int | None = None,
                 breaker: CircuitBreaker | None = None, disabled_reason: str | None = None,
                 embedded: Any = None) -> None:
        self.store_url = store_url
        self.target = target
        self.signing_key = signing_key
        self.node = node or settings.node_name()
        self.ttl_ms = int((ttl_seconds or settings.cache_ttl_seconds()) * 1000)
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout or settings.redis_timeout()
        self.lease_ms = int(lease_seconds * 1000)
        self.poll_interval = poll_interval
        self.max_artifact_bytes = max_artifact_bytes or settings.max_artifact_bytes()
        self.breaker = breaker or CircuitBreaker()
        self.embedded = embedded
        self.disabled_reason = disabled_reason if store_url else (disabled_reason or "disabled")
        self.last_error: str | None = None
        self.read_only = False  # learnt from the first write the store's ACL refuses
        self._client = None
        self._client_lock = threading.Lock()
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}
        self._pending_node: dict[str, float] = {}
        self._pending_fp: dict[str, dict[str, float]] = {}
        self._fingerprints: dict[int, tuple[CacheAdapter, Fingerprint]] = {}
        self._library_fp: dict[str, str] = {}
        self._task_fp: dict[str, str] = {}
        self._stale: dict[str, bytes] = {}  # task -> a record that existed but did not install
        self._warned: set[str] = set()
        self._last_flush = time.monotonic()

    # ----------------------------------------------------------------------- plumbing

    @property
    def display_url(self) -> str:
        return self.store_url.display if self.store_url else "(none)"

    @property
    def reachable(self) -> bool:
        return not self.breaker.is_open

    @property
    def counters(self) -> dict[str, float]:
        """This process's store counters so far (a copy)."""
        with self._lock:
            return dict(self._counts)

    def count_refusal(self, counter: str, fp: str) -> None:
        """Every refused record or blob is a corrupt_rejected; signature and safety refusals
        are also counted under their own name."""
        self.count("corrupt_rejected", fp=fp)
        if counter != "corrupt_rejected":
            self.count(counter, fp=fp)

    def count(self, name: str, value: float = 1, fp: str | None = None) -> None:
        if not value:
            return
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + value
            if name not in WARMUP_OWNED:
                self._pending_node[name] = self._pending_node.get(name, 0) + value
            if fp is not None:
                bucket = self._pending_fp.setdefault(fp, {})
                bucket[name] = bucket.get(name, 0) + value

    def _warn_once(self, key: str, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _get_client(self):
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.store_url, self.connect_timeout,
                                           self.socket_timeout)
                self._scripts = {name: self._client.register_script(src) for name, src in (
                    ("claim", _CLAIM), ("renew", _RENEW), ("release", _RELEASE),
                    ("quarantine", _QUARANTINE))}
            return self._client

    def op(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(client) through the circuit breaker; a store error raises StoreFailed."""
        if self.disabled_reason:
            self.count("store_skipped")
            raise StoreFailed("disabled", self.disabled_reason)
        if not self.breaker.allow():
            self.count("store_skipped")
            raise StoreFailed("open", "circuit breaker open")
        try:
            result = fn(self._get_client())
        except STORE_ERRORS as exc:
            raise self._failure(exc, what) from None
        self.breaker.success()
        return result

    def _failure(self, exc: BaseException, what: str) -> StoreFailed:
        kind = classify(exc)
        message = scrub(f"{type(exc).__name__}: {exc}", self.store_url.url)
        self.last_error = message
        if kind in ("down", "auth"):
            was_open = self.breaker.is_open
            self.breaker.failure()
            self.count("store_errors")
            if not was_open:
                log.warning("shared cache %s unavailable during %s (%s); continuing with local "
                            "compiles", self.display_url, what, message)
            if self.store_url.cluster:
                with self._client_lock:
                    self._client = None  # rebuild the slot map when the cluster is back
        else:
            self.breaker.success()
            log.debug("shared cache %s: %s failed: %s", self.display_url, what, message)
        return StoreFailed(kind, message)

    def _checked(self, value: Any, what: str) -> Any:
        """A pipeline result, or StoreFailed when it is an error."""
        if isinstance(value, Exception):
            raise self._failure(value, what)
        return value

    def fingerprint(self, adapter: CacheAdapter) -> Fingerprint:
        found = self._fingerprints.get(id(adapter))
        if found is None:
            fp = compute_fingerprint(adapter, self.target)
            self._fingerprints[id(adapter)] = (adapter, fp)
            self._library_fp[adapter.library] = fp.digest
            return fp
        return found[1]

    def ping(self) -> bool:
        try:
            return bool(self.op(lambda c: c.ping(), "connect"))
        except StoreFailed:
            return False

    # ----------------------------------------------------------------------- fetch

    def fetch_task(self, adapter: CacheAdapter, task_key: str) -> list[str] | None:
        return self.prefetch(adapter, [task_key]).get(task_key)

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        """fetch_task for many tasks at once in a few pipelined round trips: task records,
        then manifests, then blobs (in batches of at most 64 MiB)."""
        tasks = list(dict.fromkeys(task_keys))
        result: dict[str, list[str] | None] = dict.fromkeys(tasks)
        try:
            fp = self.fingerprint(adapter)
        except Exception as exc:  # the adapter could not describe itself
            self._warn_once(f"fp:{adapter.library}", "shared cache: no fingerprint for %s (%s); "
                            "not sharing it", adapter.library, exc)
            return result
        for task in tasks:
            self._task_fp[task] = fp.digest
        try:
            records = self._read_records(fp.digest, tasks)
            present = {e.name for e in adapter.list_entries()}
            named = {n for rec, _raw in records.values() for n in rec.entries}
            wanted = sorted(named - present)
            manifests = self._read_manifests(fp, wanted)
            installed = self._fetch_and_install(adapter, fp.digest, manifests)
        except StoreFailed:
            return result
        except OSError as exc:  # listing the local cache failed
            log.warning("shared cache: cannot list %s cache: %s", adapter.library, exc)
            return result
        self.count("local_hits", len(named & present), fp.digest)
        for task in tasks:
            found = records.get(task)
            if found is None:
                self.count("tasks_missed", fp=fp.digest)
                continue
            rec, raw = found
            if all(n in present or n in installed for n in rec.entries):
                result[task] = list(rec.entries)
                self.count("tasks_hit", fp=fp.digest)
            else:
                self._stale[task] = raw
                self.count("tasks_missed", fp=fp.digest)
        return result

    def _read_records(self, fp: str, tasks: list[str]) -> dict[str, tuple[TaskRecord, bytes]]:
        def run(client):
            pipe = client.pipeline(transaction=False)
            for task in tasks:
                key = layout.task_key(fp, task)
                pipe.get(key)
                pipe.pexpire(key, self.ttl_ms)
            return pipe.execute(raise_on_error=False)

        replies = self.op(run, "fetch") if tasks else []
        out = {}
        for i, task in enumerate(tasks):
            raw = self._checked(replies[2 * i], "fetch")
            if raw is None:
                continue
            rec = self._accept_record(fp, task, raw)
            if rec is not None:
                out[task] = (rec, raw)
        return out

    def _accept_record(self, fp: str, task: str, raw: bytes) -> TaskRecord | None:
        try:
            return layout.accept_record(raw, key=self.signing_key, fp=fp, task=task)
        except BadRecord as exc:
            self.reject(exc.counter, fp, f"task record {task}", str(exc))
            return None

    def reject(self, counter: str, fp: str, what: str, why: str) -> None:
        self.count_refusal(counter, fp)
        log.warning("shared cache: refused %s (fingerprint %s): %s", what, fp, why)

    def _read_manifests(self, fp: Fingerprint, names: list[str]) -> dict[str, tuple]:
        """name -> (Manifest, raw) for every acceptable manifest; the others are counted."""
        def run(client):
            pipe = client.pipeline(transaction=False)
            for name in names:
                key = layout.manifest_key(fp.digest, name)
                pipe.get(key)
                pipe.pexpire(key, self.ttl_ms)
            if names:
                pipe.zadd(layout.index_key(fp.digest), dict.fromkeys(names, time.time()),
                          xx=True)
                pipe.zadd(layout.FPS_KEY, {fp.digest: time.time()})
                pipe.pexpire(layout.fp_meta_key(fp.digest), self.ttl_ms)
            return pipe.execute(raise_on_error=False)

        replies = self.op(run, "fetch") if names else []
        out = {}
        for i, name in enumerate(names):
            raw = self._checked(replies[2 * i], "fetch")
            if raw is None:
                continue
            man = self._accept_manifest(fp, name, raw)
            if man is not None:
                out[name] = (man, raw)
        return out

    def _accept_manifest(self, fp: Fingerprint, name: str, raw: bytes) -> Manifest | None:
        try:
            return layout.accept_manifest(raw, key=self.signing_key,
                                          max_size=self.max_artifact_bytes, fp=fp.digest,
                                          name=name, library=fp.library)
        except layout.RefusedHere as exc:
            self.refused_here(fp.digest, name, str(exc))
        except layout.SignatureRefused as exc:
            # Not quarantined: a node with a wrong key must not wipe valid entries.
            self.reject(exc.counter, fp.digest, f"entry {name}", str(exc))
        except BadRecord as exc:
            if self._signed_ok(raw):
                self.quarantine(fp.digest, name, raw, str(exc))
            else:  # unsigned garbage under a signing key proves nothing about the entry
                self.reject("signature_rejected", fp.digest, f"entry {name}", str(exc))
        return None

    def _signed_ok(self, raw: bytes) -> bool:
        """True without a signing key, or when raw is a JSON object validly signed."""
        if not self.signing_key:
            return True
        try:
            return check_signature(layout.load_record(raw), self.signing_key) is None
        except BadRecord:
            return False

    def refused_here(self, fp: str, name: str, why: str) -> None:
        """A miss this node cannot use (its own limits, an incompatible build): counted,
        never quarantined, so nodes that can use the entry keep it."""
        self.count("refused_here", fp=fp)
        log.warning("shared cache: not using entry %s here (fingerprint %s): %s", name, fp, why)

    def _fetch_and_install(self, adapter: CacheAdapter, fp: str,
                           manifests: dict[str, tuple]) -> set[str]:
        """Read and verify blobs batch by batch; install the good ones in a few threads
        (installs wait on fsync, so they overlap well)."""
        installed: set[str] = set()

        def one(man: Manifest, raw: bytes, blob) -> None:
            if isinstance(blob, BadRecord):
                self.quarantine(fp, man.name, raw, str(blob), man.digest)
            elif blob is not None and self._install(adapter, fp, man, raw, blob):
                installed.add(man.name)

        with ThreadPoolExecutor(INSTALL_THREADS, thread_name_prefix="warmd-install") as pool:
            for batch in layout.size_batches(list(manifests.values()), BLOB_BATCH_BYTES):
                blobs = self.read_blobs([man for man, _raw in batch])
                jobs = [pool.submit(one, man, raw, blobs.get(man.digest)) for man, raw in batch]
                for job in jobs:
                    job.result()
        return installed

    def read_blobs(self, manifests: list[Manifest]) -> dict[str, bytes | BadRecord]:
        unique = list({man.digest: man for man in manifests}.values())

        def run(client):
            pipe = client.pipeline(transaction=False)
            for man in unique:
                for i in range(man.chunks):
                    key = layout.blob_key(man.digest, i)
                    pipe.get(key)
                    pipe.pexpire(key, self.ttl_ms)
            return pipe.execute(raise_on_error=False)

        replies = iter(self.op(run, "fetch") if unique else [])
        out: dict[str, bytes | BadRecord] = {}
        for man in unique:
            chunks, wrong = [], None
            for i in range(man.chunks):
                reply = next(replies)
                next(replies)  # the PEXPIRE: refused for a read-only user, which is fine
                if isinstance(reply, Exception) and classify(reply) == "error":
                    wrong = BadRecord(f"chunk {i} is unreadable: {reply}")  # e.g. WRONGTYPE
                    reply = None
                chunks.append(self._checked(reply, "fetch"))
            try:
                out[man.digest] = wrong or layout.check_blob(man, chunks)
            except BadRecord as exc:
                out[man.digest] = exc
        return out

    def _install(self, adapter: CacheAdapter, fp: str, man: Manifest, raw: bytes,
                 blob: bytes) -> bool:
        limit = min(self.max_artifact_bytes, settings.max_artifact_bytes())
        if unpacks_over(blob, limit):
            self.refused_here(fp, man.name, f"unpacks to more than this node's {limit}-byte "
                              "limit")
            return False
        try:
            adapter.install(man.name, blob)
        except IncompatibleHere as exc:
            self.refused_here(fp, man.name, str(exc))
            return False
        except UnsafeArtifact as exc:
            self.quarantine(fp, man.name, raw, f"unsafe artifact: {exc}", man.digest,
                             counter="unsafe_rejected")
            return False
        except Exception as exc:  # a local problem (disk full, permissions): not the entry's
            self.count("install_failed", fp=fp)
            log.warning("shared cache: installing %s into %s failed: %s", man.name,
                        adapter.root, exc)
            return False
        self.count("remote_hits", fp=fp)
        self.count("bytes_fetched", len(blob), fp)
        self.count("compile_seconds_saved", man.compile_seconds, fp)
        return True

    def quarantine(self, fp: str, name: str, raw: bytes, why: str, digest: str | None = None,
                    counter: str = "corrupt_rejected") -> None:
        """Move a bad manifest aside so the entry is rebuilt and republished; best effort
        (a read-only user cannot). Its blob's chunks stay: other manifests (under any
        fingerprint) may share them, a republication overwrites them, and `prune` removes
        them once nothing references them. `digest` is accepted for callers' symmetry."""
        self.reject(counter, fp, f"entry {name}", f"{why}; quarantining it")
        try:
            note = layout.load_record(raw)
        except BadRecord:
            note = {"raw": repr(raw[:200])}
        value = layout.json_bytes({"manifest": note, "reason": why, "node": self.node,
                                   "at": time.time()})

        def run(client):
            moved = self._scripts["quarantine"](
                keys=[layout.manifest_key(fp, name), layout.quarantine_key(fp, name),
                      layout.index_key(fp)],
                args=[raw, value, QUARANTINE_TTL_MS, name], client=client)
            return moved

        try:
            if self.op(run, "quarantine"):
                self.count("quarantined", fp=fp)
        except StoreFailed:
            pass

    # ----------------------------------------------------------------------- single flight

    @contextlib.contextmanager
    def single_flight(self, task_key: str, timeout: float):
        fp = self._task_fp.get(task_key, "-")
        lease = None
        try:
            should_compile, lease = self._claim(fp, task_key, timeout)
        except StoreFailed:
            should_compile = True
        if lease is None:
            yield should_compile
            return
        with lease:
            yield True

    def _claim(self, fp: str, task: str, timeout: float) -> tuple[bool, _Lease | None]:
        token = f"{self.node}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        stale = self._stale.get(task, b"")
        state, holder = self._try_claim(fp, task, token, stale)
        if state != "held":
            return self._claimed(state, fp, task, token, waited=False)
        self.count("lease_waits", fp=fp)
        log.info("shared cache: %s is being compiled by %s; waiting", task, holder)
        deadline = time.monotonic() + timeout
        # Subscribed only now: a publication in between is found by the next poll.
        with self._subscription(layout.channel(fp, task)) as wait:
            while state == "held":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.count("lease_timeouts", fp=fp)
                    log.warning("shared cache: waited %.0f s for %s (held by %s); compiling it "
                                "here", timeout, task, holder)
                    return True, None
                wait(min(self.poll_interval, remaining))
                state, holder = self._try_claim(fp, task, token, stale)
        return self._claimed(state, fp, task, token, waited=True)

    def _claimed(self, state: str, fp: str, task: str, token: str, waited: bool
                 ) -> tuple[bool, _Lease | None]:
        if state == "published":
            self.count("lease_waits_satisfied" if waited else "published_meanwhile", fp=fp)
            return False, None
        if state == "acquired":
            self.count("lease_takeovers" if waited else "leases_acquired", fp=fp)
            return True, _Lease(self, fp, task, token)
        return True, None  # "free": a read-only user and nobody compiling: we do

    def _try_claim(self, fp: str, task: str, token: str, stale: bytes) -> tuple[str, str]:
        rec_key, lease_key = layout.task_key(fp, task), layout.lease_key(fp, task)
        if not self.read_only:
            try:
                state, holder = self.op(lambda c: self._scripts["claim"](
                    keys=[rec_key, lease_key], args=[token, self.lease_ms, stale], client=c),
                    "lease")
            except StoreFailed as failed:
                if failed.kind not in ("denied", "readonly"):
                    raise
                self._note_read_only(failed)
            else:
                return {2: "published", 1: "acquired"}.get(int(state), "held"), _text(holder)

        def peek(client):
            pipe = client.pipeline(transaction=False)
            pipe.get(rec_key)
            pipe.get(lease_key)
            return pipe.execute()

        rec, holder = self.op(peek, "lease")
        if rec is not None and rec != stale:
            return "published", ""
        return ("held", _text(holder)) if holder else ("free", "")

    @contextlib.contextmanager
    def _subscription(self, name: str):
        """A wait(seconds) function that returns early when `name` gets a message; a plain
        sleep when pub/sub is unavailable (polling still finds publications)."""
        pubsub = None
        try:
            pubsub = self.op(lambda c: c.pubsub(ignore_subscribe_messages=True), "subscribe")
            pubsub.subscribe(name)
        except (StoreFailed, *STORE_ERRORS):
            pubsub = None

        def wait(seconds: float) -> None:
            nonlocal pubsub
            if pubsub is None:
                time.sleep(seconds)
                return
            try:
                pubsub.get_message(timeout=seconds)
            except STORE_ERRORS:
                pubsub = None
                time.sleep(seconds)

        try:
            yield wait
        finally:
            if pubsub is not None:
                with contextlib.suppress(*STORE_ERRORS):
                    pubsub.close()

    def _note_read_only(self, failed: StoreFailed) -> None:
        self.read_only = True
        self._warn_once("read_only", "shared cache %s refuses this user's writes (%s): "
                        "reading only, nothing will be published", self.display_url,
                        failed.kind)

    # ----------------------------------------------------------------------- publish

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> None:
        if not entries:
            return
        try:
            fp = self.fingerprint(adapter)
        except Exception:
            return
        if self.disabled_reason or self.read_only:
            self.count("publish_skipped", fp=fp.digest)
            return
        packed = self._pack(adapter, fp, entries, compile_seconds)
        if packed is None:
            return
        rec = TaskRecord(fp.digest, task_key, tuple(m.name for m, _ in packed), self.node,
                         float(compile_seconds))
        rec_raw = layout.json_bytes(sign(rec.to_json(), self.signing_key))
        try:
            new = self.write_entries(fp, packed)
            self._write_record(fp, task_key, rec_raw)
        except StoreFailed as failed:
            self._publish_failed(failed, fp.digest)
            return
        self._stale.pop(task_key, None)
        self.count("published", len(new), fp.digest)
        self.count("already_published", len(packed) - len(new), fp.digest)
        self.count("bytes_published", sum(len(b) for _m, b in new), fp.digest)
        self.count("compile_seconds", float(compile_seconds), fp.digest)
        self._maybe_flush()

    def _pack(self, adapter: CacheAdapter, fp: Fingerprint, entries: list[CacheEntry],
              compile_seconds: float) -> list[tuple[Manifest, bytes]] | None:
        share = float(compile_seconds) / len(entries)
        packed = []
        for entry in entries:
            try:
                blob = adapter.pack(entry)
            except Exception as exc:  # unsafe or vanished entry: publish nothing of the task
                self.count("publish_failed", fp=fp.digest)
                log.warning("shared cache: cannot pack %s: %s", entry.name, exc)
                return None
            if len(blob) > self.max_artifact_bytes or not layout.is_entry_name(entry.name):
                self.count("publish_failed", fp=fp.digest)
                log.warning("shared cache: not publishing %s (%d bytes): too large or a bad "
                            "name", entry.name, len(blob))
                return None
            man = Manifest(adapter.library, entry.name, fp.digest, layout.sha256(blob),
                           len(blob), self.node, share, time.time())
            signed = sign(man.to_json(), self.signing_key)
            packed.append((Manifest(**signed), blob))
        return packed

    def write_entries(self, fp: Fingerprint, packed: list[tuple[Manifest, bytes]]
                       ) -> list[tuple[Manifest, bytes]]:
        """Blobs first (a manifest is never visible before its chunks), then manifests;
        entries another node already published are left alone."""
        def exists(client):
            pipe = client.pipeline(transaction=False)
            for man, _blob in packed:
                pipe.exists(layout.manifest_key(fp.digest, man.name))
            return pipe.execute()

        there = self.op(exists, "publish")
        new = [p for p, found in zip(packed, there, strict=True) if not found]

        def chunks(client):
            pipe = client.pipeline(transaction=False)
            for man, blob in new:
                for i, chunk in enumerate(layout.split_chunks(blob, man.chunk_size)):
                    pipe.set(layout.blob_key(man.digest, i), chunk, px=self.ttl_ms)
            return pipe.execute()

        def manifests(client):
            pipe = client.pipeline(transaction=False)
            for man, _blob in new:
                pipe.set(layout.manifest_key(fp.digest, man.name), man.encode(), nx=True,
                         px=self.ttl_ms)
            pipe.zadd(layout.index_key(fp.digest), {m.name: time.time() for m, _ in packed})
            pipe.set(layout.fp_meta_key(fp.digest), layout.json_bytes(fp.to_json()),
                     px=self.ttl_ms)
            pipe.zadd(layout.FPS_KEY, {fp.digest: time.time()})
            return pipe.execute()

        if new:
            self.op(chunks, "publish")
        self.op(manifests, "publish")
        return new

    def _write_record(self, fp: Fingerprint, task: str, rec_raw: bytes) -> None:
        def run(client):
            client.set(layout.task_key(fp.digest, task), rec_raw, px=self.ttl_ms)
            client.publish(layout.channel(fp.digest, task), b"published")

        self.op(run, "publish")

    def _publish_failed(self, failed: StoreFailed, fp: str) -> None:
        if failed.kind == "denied":
            self.count("publish_denied", fp=fp)
            self._note_read_only(failed)
        elif failed.kind in ("oom", "readonly"):
            self.count("publish_failed", fp=fp)
            self._warn_once(failed.kind, "shared cache %s cannot store new entries (%s); "
                            "warmup continues, results stay local", self.display_url,
                            "out of memory: see docs/redis.md on maxmemory"
                            if failed.kind == "oom" else "read-only replica")
        else:
            self.count("publish_failed", fp=fp)

    # ----------------------------------------------------------------------- stats

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
                    bucket = self._pending_fp.setdefault(fp, {})
                    bucket[field] = bucket.get(field, 0) + float(value)
                elif not dot:
                    self._pending_node[name] = self._pending_node.get(name, 0) + float(value)
        self.flush_stats()

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush > FLUSH_INTERVAL:
            self.flush_stats()

    def flush_stats(self) -> bool:
        """Push pending counters to Redis (HINCRBYFLOAT); kept for later when that fails."""
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
            self.op(run, "stats")
            return True
        except StoreFailed as failed:
            if failed.kind in ("down", "open", "auth"):
                self._restore_pending(node, fps)
            return False

    def _restore_pending(self, node: dict, fps: dict) -> None:
        with self._lock:
            for name, value in node.items():
                self._pending_node[name] = self._pending_node.get(name, 0) + value
            for fp, bucket in fps.items():
                mine = self._pending_fp.setdefault(fp, {})
                for name, value in bucket.items():
                    mine[name] = mine.get(name, 0) + value

    # ----------------------------------------------------------------------- sharding

    def shard_order(self, task_keys: list[str]) -> list[str]:
        """The order in which this node should try a plan's tasks so that N nodes warming the
        same plan start on different tasks: each arrival gets a counter value i and starts
        at position frac(i * golden ratio) of the list. Unchanged when the store is down."""
        keys = list(task_keys)
        if len(keys) < 2:
            return keys
        plan = layout.sha256("\n".join(sorted(keys)).encode())[:16]
        arrivals = f"{layout.PREFIX}arrivals:{plan}"

        def run(client):
            pipe = client.pipeline(transaction=False)
            pipe.incr(arrivals)
            pipe.expire(arrivals, 3600)
            return pipe.execute()

        try:
            arrival = int(self.op(run, "shard")[0])
        except StoreFailed:
            return keys
        start = int(((arrival - 1) * 0.6180339887498949) % 1.0 * len(keys))
        return keys[start:] + keys[:start]

    def close(self) -> None:
        self.flush_stats()
        with self._client_lock:
            if self._client is not None:
                with contextlib.suppress(*STORE_ERRORS):
                    self._client.close()
                self._client = None


class _Lease:
    """A held single-flight lease: renewed in a thread while the body runs, then released
    (compare-and-delete) with a notice on the task's channel so waiters look again at once."""

    def __init__(self, store: RedisSharedCache, fp: str, task: str, token: str) -> None:
        self.store, self.fp, self.task, self.token = store, fp, task, token
        self.key = layout.lease_key(fp, task)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name=f"warmd-lease-{task[:40]}")

    def __enter__(self) -> _Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        store = self.store

        def run(client):
            store._scripts["release"](keys=[self.key], args=[self.token], client=client)
            client.publish(layout.channel(self.fp, self.task), b"released")

        with contextlib.suppress(StoreFailed):
            store.op(run, "lease release")

    def _renew(self) -> None:
        store = self.store
        every = store.lease_ms / 3000
        while not self._stop.wait(every):
            try:
                held = store.op(lambda c: store._scripts["renew"](
                    keys=[self.key], args=[self.token, store.lease_ms], client=c), "lease renew")
            except StoreFailed:
                continue
            if not held:
                store.count("lease_lost", fp=self.fp)
                log.warning("shared cache: lost the lease on %s (it expired); finishing the "
                            "compile anyway", self.task)
                return


def unpacks_over(blob: bytes, limit: int) -> bool:
    """Whether a gzip'd artifact decompresses to more than limit bytes (measured in bounded
    steps, nothing kept). A blob that is not gzip is left to the adapter's own checks."""
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total, data = 0, blob
    try:
        while data and not decomp.eof:
            total += len(decomp.decompress(data, 1 << 20))
            if total > limit:
                return True
            data = decomp.unconsumed_tail
    except zlib.error:
        return False
    return False


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value) if value else ""
