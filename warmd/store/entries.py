"""Reading entries: task records, manifests and blobs, each verified (layout's decoders,
signatures, digests) before an adapter installs it; bad entries quarantined, entries this
node cannot use left alone.

Reads are bounded and stay reads: every pipeline holds at most READ_WINDOW_BYTES of blob
chunks (or KEYS_PER_WINDOW records), so a thousand nodes joining at once cost the server a
bounded reply buffer each; what verified has its TTL renewed at most once per RENEW interval
per plan across the cluster (one node wins a marker and renews for all); with replica reads
on, what a replica answered as absent or refused is asked again of the primary before it
counts, so replica lag never quarantines a valid entry. Given peers (warmd.cluster.fanout),
blobs come from other nodes first, verified exactly like the store's."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

from warmd import boundedjson, settings
from warmd.cache.artifacts import TooLargeHere
from warmd.cache.base import CacheAdapter, IncompatibleHere, UnsafeArtifact
from warmd.cache.install import install_batch
from warmd.store import layout
from warmd.store.api import BlobPeers, StoreFailed
from warmd.store.connection import classify
from warmd.store.fingerprint import Fingerprint
from warmd.store.layout import BadRecord, Manifest, StoredTaskRecord
from warmd.store.session import Session, StaleRecords
from warmd.store.signing import check as check_signature

log = logging.getLogger("warmd.store")

BLOB_BATCH_BYTES = 64 << 20  # bound on blob bytes held in memory during a prefetch
READ_WINDOW_BYTES = 1 << 20  # bound on blob bytes one pipeline asks for (docs/redis.md)
KEYS_PER_WINDOW = 128  # records or manifests one pipeline asks for
INSTALL_THREADS = 8
RENEW_MAX_INTERVAL = 86400.0  # seconds: the TTL of what a plan used is renewed this often
PEER_WAIT = 10.0  # seconds a node waits for another that is reading a blob from the store


class Entries:
    def __init__(self, session: Session, stale: StaleRecords,
                 peers: BlobPeers | None = None) -> None:
        self.session = session
        self.stale = stale  # written here: records found but not usable
        self.peers = peers
        self.op = session.transport.op
        self.count = session.stats.count
        # (library, entry) -> compile seconds its manifest recorded, for what this process
        # installed: the warmup's saved time and the node's task record take them.
        self.installed: dict[tuple[str, str], float] = {}

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        """SharedCache.prefetch in bounded pipelined round trips: task records, then
        manifests, then blobs (from peers first when there are any); then one renewal of
        what verified, when no node renewed this plan lately."""
        tasks = list(dict.fromkeys(task_keys))
        result: dict[str, list[str] | None] = dict.fromkeys(tasks)
        try:
            fp = self.session.fingerprint(adapter)
        except Exception as exc:  # the adapter could not describe itself
            self.session.warn_once(f"fp:{adapter.library}", "shared cache: no fingerprint for %s "
                             "(%s); not sharing it", adapter.library, exc)
            return result
        for task in tasks:
            self.session.task_fp[task] = fp.digest
        used = Used(fp.digest)
        try:
            with self._timed("fetch_seconds", fp.digest):
                records = self.read_records(fp.digest, tasks)
                used.keys += [layout.task_key(fp.digest, t) for t in records]
                present = {e.name for e in adapter.list_entries()}
                named = {n for rec, _raw in records.values() for n in rec.entries}
                manifests = self.read_manifests(fp, sorted(named - present))
                used.add_manifests(manifests)
            installed = self._fetch_and_install(adapter, fp.digest, manifests, used)
        except StoreFailed:
            return result
        except OSError as exc:  # listing the local cache failed
            log.warning("shared cache: cannot list %s cache: %s", adapter.library, exc)
            return result
        except Exception as exc:  # a bug or an unforeseen value: a miss, never a failed task
            self.count("fetch_failed", fp=fp.digest)
            log.warning("shared cache: fetching %s failed (%s: %s); compiling locally",
                        adapter.library, type(exc).__name__, exc)
            return result
        self.renew(used, tasks)
        self._count_hits("local_hits", fp.digest, named & present)
        for task in tasks:
            found = records.get(task)
            if found is None:
                self._count_task(fp.digest, task, "tasks_missed")
                continue
            rec, raw = found
            if all(n in present or n in installed for n in rec.entries):
                result[task] = list(rec.entries)
                self._count_task(fp.digest, task, "tasks_hit")
            else:
                self.stale.note(task, raw)
                self._count_task(fp.digest, task, "tasks_missed")
        return result

    @contextlib.contextmanager
    def _timed(self, counter: str, fp: str) -> Iterator[None]:
        """Add the block's wall time to a seconds counter (fetch_seconds: reading from the
        store; install_seconds: writing into the local cache), even when it raises."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.count(counter, time.monotonic() - began, fp)

    def _count_hits(self, counter: str, fp: str, names: Iterable[str]) -> None:
        """Count entries as hits, each once per process (warmup fetches a task again after
        the plan's prefetch installed it: that is not a second hit)."""
        self.count(counter, len(self.session.first_hits(fp, names)), fp)

    def _count_task(self, fp: str, task: str, outcome: str) -> None:
        if self.session.first_task_outcome(fp, task, outcome):
            self.count(outcome, fp=fp)

    # -- reading, in bounded windows; a replica's "absent" or "refused" asked again --------

    def _get(self, keys: list[str], replicas: bool) -> list:
        """GET each key, KEYS_PER_WINDOW per round trip: the replies, errors left in place.
        Nothing is touched here: only what verifies has its TTL renewed (renew)."""
        replies: list = []
        for at in range(0, len(keys), KEYS_PER_WINDOW):
            window = keys[at:at + KEYS_PER_WINDOW]

            def run(client, window=window):
                pipe = client.pipeline(transaction=False)
                for key in window:
                    pipe.get(key)
                return pipe.execute(raise_on_error=False)

            replies += self.op(run, "fetch", replicas=replicas)
        return replies

    def _read_checked(self, keys: list[str], check: Callable[[int, bytes], object]) -> list:
        """check(i, raw) for each key's value (None where it is absent). With replica reads,
        every key a replica answered as absent, or whose value check refused (a BadRecord),
        is read again from the primary and checked again: a lagging replica is no refusal
        and no miss."""
        replicas = self.session.transport.replica_reads
        results = [None if raw is None else check(i, raw)
                   for i, raw in enumerate(map(self._string, self._get(keys, replicas)))]
        again = [i for i, r in enumerate(results) if r is None or isinstance(r, BadRecord)]
        if replicas and again:
            fresh = self._get([keys[i] for i in again], replicas=False)
            for i, reply in zip(again, fresh, strict=True):
                raw = self._string(reply)
                results[i] = None if raw is None else check(i, raw)
        return results

    def read_records(self, fp: str, tasks: list[str]
                     ) -> dict[str, tuple[StoredTaskRecord, bytes]]:
        """task -> (record, its bytes) for every acceptable task record; the others are
        counted and noted stale."""
        raws: dict[int, bytes] = {}

        def check(i: int, raw: bytes):
            raws[i] = raw
            try:
                return layout.accept_record(raw, key=self.session.signing_key, fp=fp,
                                            task=tasks[i])
            except BadRecord as exc:
                return exc

        out = {}
        keys = [layout.task_key(fp, task) for task in tasks]
        for i, found in enumerate(self._read_checked(keys, check)):
            if isinstance(found, BadRecord):
                self.stale.note(tasks[i], raws[i])  # not a publication: the lease is taken
                self.reject(found.counter, fp, f"task record {tasks[i]}", str(found))
            elif found is not None:
                out[tasks[i]] = (found, raws[i])
        return out

    def read_manifests(self, fp: Fingerprint, names: list[str]) -> dict[str, tuple]:
        """name -> (Manifest, raw) for every acceptable manifest; the others are counted
        (and quarantined, or noted as refused here)."""
        raws: dict[int, bytes] = {}

        def check(i: int, raw: bytes):
            raws[i] = raw
            try:
                return layout.accept_manifest(raw, key=self.session.signing_key,
                                              max_size=self.session.max_artifact_bytes,
                                              fp=fp.digest, name=names[i], library=fp.library)
            except layout.RefusedHere as exc:
                return exc
            except BadRecord as exc:
                return exc

        keys = [layout.manifest_key(fp.digest, n) for n in names]
        out = {}
        for i, found in enumerate(self._read_checked(keys, check)):
            if isinstance(found, layout.RefusedHere):
                self.refused_here(fp.digest, names[i], str(found))
            elif isinstance(found, BadRecord):
                self.refuse_entry(fp.digest, names[i], raws[i], found)
            elif found is not None:
                out[names[i]] = (found, raws[i])
        return out

    def _string(self, reply) -> bytes | None:
        """A GET reply; a key of another Redis type (WRONGTYPE) reads as layout.WRONG_TYPE,
        which no decoder accepts; other errors raise StoreFailed."""
        if isinstance(reply, Exception) and classify(reply) == "error":
            return layout.WRONG_TYPE
        return self.session.transport.checked(reply, "fetch")

    # -- renewing what was used ------------------------------------------------------------

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

    # -- blobs -----------------------------------------------------------------------------

    def install_named(self, adapter: CacheAdapter, fp: Fingerprint, names: Iterable[str]
                      ) -> set[str]:
        """Install the named entries of fp (no task record involved): the names installed
        now; what is missing or refused is counted and left out. Raises StoreFailed."""
        used = Used(fp.digest)
        with self._timed("fetch_seconds", fp.digest):
            manifests = self.read_manifests(fp, sorted(set(names)))
            used.add_manifests(manifests)
        installed = self._fetch_and_install(adapter, fp.digest, manifests, used)
        self.renew(used, sorted(manifests))
        return installed

    def _fetch_and_install(self, adapter: CacheAdapter, fp: str,
                           manifests: dict[str, tuple], used: Used | None = None) -> set[str]:
        """Get and verify blobs batch by batch; install the good ones in a few threads
        (installs wait on fsync, so they overlap well; the cache root's own fsync is one per
        batch)."""
        installed: set[str] = set()
        used = used or Used(fp)

        def one(man: Manifest, raw: bytes, blob) -> None:
            if isinstance(blob, BadRecord):
                self.quarantine(fp, man.name, raw, str(blob))
            elif blob is not None and self._install(adapter, fp, man, raw, blob):
                installed.add(man.name)

        wanted = [(man, raw) for man, raw in manifests.values()
                  if (fp, man.name, man.digest) not in self.session.refused_entries]
        with ThreadPoolExecutor(INSTALL_THREADS, thread_name_prefix="warmd-install") as pool:
            for batch in layout.size_batches(wanted, BLOB_BATCH_BYTES):
                with self._timed("fetch_seconds", fp):
                    blobs = self.blobs([man for man, _raw in batch], fp, used)
                with self._timed("install_seconds", fp), install_batch():
                    context = copy_context()
                    jobs = [pool.submit(context.copy().run, one, man, raw,
                                        blobs.get(man.digest)) for man, raw in batch]
                    for job in jobs:
                        job.result()
        return installed

    def blobs(self, manifests: list[Manifest], fp: str, used: Used
              ) -> dict[str, bytes | BadRecord]:
        """digest -> the verified blob, or the BadRecord saying why the store's is not
        usable: from peers first (when there are any), the rest from the store, which this
        node then offers to the others."""
        unique = {man.digest: man for man in manifests}
        out: dict[str, bytes | BadRecord] = {}
        if self.peers is not None:
            self._from_peers(unique, out, fp, used)
        rest = [man for digest, man in unique.items() if digest not in out]
        out.update(self._from_store(rest, used))
        return out

    def _from_store(self, manifests: list[Manifest], used: Used
                    ) -> dict[str, bytes | BadRecord]:
        found = self.read_blobs(manifests, used)
        if self.peers is not None:
            verified = {d: b for d, b in found.items() if isinstance(b, bytes)}
            if verified:
                self.peers.offer(verified)
        return found

    def _from_peers(self, unique: dict[str, Manifest], out: dict, fp: str, used: Used
                    ) -> None:
        """Fill out with what peers serve and verifies; what this node is told to read from
        the store it reads at once (others wait for it); what another node is reading is
        asked for again, for at most PEER_WAIT seconds, then read from the store."""
        assert self.peers is not None
        deadline = time.monotonic() + PEER_WAIT
        pending, attempt = list(unique), 0
        while pending:
            answer = self.peers.lookup(pending)
            mine = [d for d in answer.from_store if d in unique]
            verified: dict[str, bytes] = {}
            for digest, (data, peer) in answer.blobs.items():
                man = unique.get(digest)
                if man is None:
                    continue
                try:
                    out[digest] = layout.verify_blob(man, data if isinstance(data, bytes)
                                                     else b"")
                except BadRecord as exc:
                    self.peers.refused(digest, peer)
                    self.count("peer_refused", fp=fp)
                    log.warning("shared cache: refused %s from peer %s: %s; reading it from "
                                "the store", man.name, peer, exc)
                    mine.append(digest)
                    continue
                verified[digest] = data
                self.count("peer_hits", fp=fp)
                self.count("bytes_from_peers", len(data), fp)
            if verified:  # this node serves them next (before it installs them)
                self.peers.offer(verified)
            if mine:
                out.update(self._from_store([unique[d] for d in mine], used))
            pending = [d for d in answer.later if d in unique and d not in out]
            if pending:
                if time.monotonic() >= deadline:
                    return  # the rest from the store
                time.sleep(min(1.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0))
                attempt += 1

    def read_blobs(self, manifests: list[Manifest], used: Used | None = None
                   ) -> dict[str, bytes | BadRecord]:
        """digest -> the verified blob, or the BadRecord saying why it is not usable. Each
        chunk is read with GETRANGE up to one byte past its declared length, so what comes
        back is bounded by the manifests' sizes whatever the store holds, in pipelines of at
        most READ_WINDOW_BYTES; with replica reads, a blob that does not verify is read again
        from the primary. The chunks of verified blobs join `used` (renewed later)."""
        unique = list({man.digest: man for man in manifests}.values())
        replicas = self.session.transport.replica_reads
        out = {man.digest: self._verified_blob(man, chunks)
               for man, chunks in zip(unique, self._chunks(unique, replicas), strict=True)}
        again = [man for man in unique if isinstance(out[man.digest], BadRecord)]
        if replicas and again:
            for man, chunks in zip(again, self._chunks(again, False), strict=True):
                out[man.digest] = self._verified_blob(man, chunks)
        if used is not None:
            used.keys += [layout.blob_key(man.digest, i) for man in unique
                          if not isinstance(out[man.digest], BadRecord)
                          for i in range(man.chunks)]
        return out

    def _chunks(self, manifests: list[Manifest], replicas: bool) -> list[list]:
        """Every chunk of every blob (replies, errors left in place), in windows of at most
        READ_WINDOW_BYTES (one chunk at least)."""
        reads = [(at, layout.blob_key(man.digest, i), length)
                 for at, man in enumerate(manifests)
                 for i, length in enumerate(layout.chunk_lengths(man))]
        chunks: list[list] = [[] for _ in manifests]
        for window in _windows(reads, READ_WINDOW_BYTES):
            def run(client, window=window):
                pipe = client.pipeline(transaction=False)
                for _at, key, length in window:
                    pipe.getrange(key, 0, length)
                return pipe.execute(raise_on_error=False)

            for (at, _key, _length), reply in zip(window, self.op(run, "fetch",
                                                                  replicas=replicas),
                                                  strict=True):
                chunks[at].append(reply)
        return chunks

    def _verified_blob(self, man: Manifest, chunks: list) -> bytes | BadRecord:
        for i, reply in enumerate(chunks):
            if isinstance(reply, Exception):
                if classify(reply) != "error":
                    raise self.session.transport.failure(reply, "fetch")
                return BadRecord(f"chunk {i} is unreadable: {reply}")  # e.g. WRONGTYPE
        try:
            return layout.check_blob(man, chunks)
        except BadRecord as exc:
            return exc

    def _install(self, adapter: CacheAdapter, fp: str, man: Manifest, raw: bytes,
                 blob: bytes) -> bool:
        limit = self.session.max_artifact_bytes
        if limit < settings.max_artifact_bytes() and unpacks_over(blob, limit):
            # (the adapter checks the node-wide limit itself, in the one pass that unpacks)
            self.refused_here(fp, man.name, f"unpacks to more than this node's {limit}-byte "
                              "limit", man.digest)
            return False
        try:
            adapter.install(man.name, blob)
        except TooLargeHere as exc:  # this node's own limit: the entry works elsewhere
            self.refused_here(fp, man.name, str(exc), man.digest)
            return False
        except IncompatibleHere as exc:
            self.refused_here(fp, man.name, str(exc), man.digest, replaceable=True)
            return False
        except REFUSED_CONTENT as exc:  # what the entry holds, not this node: for everyone
            self.quarantine(fp, man.name, raw, f"unsafe artifact: {_refusal(exc)}",
                            counter="unsafe_rejected")
            return False
        except Exception as exc:  # a local problem (disk full, permissions): not the entry's
            self.count("install_failed", fp=fp)
            log.warning("shared cache: installing %s into %s failed: %s", man.name,
                        adapter.root, exc)
            return False
        self._count_hits("remote_hits", fp, [man.name])
        self.installed[(adapter.library, man.name)] = float(man.compile_seconds or 0.0)
        self.count("bytes_fetched", len(blob), fp)
        self.count("compile_seconds_saved", man.compile_seconds, fp)
        return True

    # -- refusals --------------------------------------------------------------------------

    def refuse_entry(self, fp: str, name: str, raw: bytes, problem: BadRecord,
                     counter: str | None = None) -> None:
        """A manifest refused for what it is (undecodable, another Redis type, unsigned or
        badly signed): quarantined, so a correct publish replaces it, when this node may
        heal the store (quarantine says when); a signature of another key is remembered as
        evidence that this node's key may not be the cluster's."""
        counter = counter or problem.counter
        if counter == "corrupt_rejected" and not self._signed_ok(raw):
            counter = "signature_rejected"  # unsigned garbage under a signing key
        if isinstance(problem, layout.SignatureRefused) and problem.other_key:
            self.session.cluster_key.note_other_key()
        self.quarantine(fp, name, raw, str(problem), counter=counter)

    def _signed_ok(self, raw: bytes) -> bool:
        """True without a signing key, or when raw is a JSON object validly signed."""
        if not self.session.signing_key:
            return True
        try:
            return check_signature(layout.load_record(raw), self.session.signing_key) is None
        except BadRecord:
            return False

    def reject(self, counter: str, fp: str, what: str, why: str) -> None:
        """Count and log a refused record or entry (left where it is)."""
        self.session.stats.count_refusal(counter, fp)
        log.warning("shared cache: refused %s (fingerprint %s): %s", what, fp, why)

    def refused_here(self, fp: str, name: str, why: str, digest: str | None = None,
                     replaceable: bool = False) -> None:
        """A miss this node cannot use (its own limits, an incompatible build): counted,
        never quarantined, so nodes that can use the entry keep it. Given the blob's
        digest, remembered: this process does not fetch and check that blob again; and
        when replaceable (a build that does not work here, not a limit of this node's),
        this node's own publish replaces it (Publisher._replaceable) rather than leave it
        to its TTL while every node like this one compiles again."""
        if digest is not None:
            self.session.refused_entries[(fp, name, digest)] = why
            if replaceable:
                self.session.incompatible_here.add((fp, name, digest))
        self.count("refused_here", fp=fp)
        log.warning("shared cache: not using entry %s here (fingerprint %s): %s", name, fp, why)

    def quarantine(self, fp: str, name: str, raw: bytes, why: str,
                   counter: str = "corrupt_rejected") -> bool:
        """Move a bad manifest aside so the entry is rebuilt and republished; best effort
        (a read-only user cannot). Returns whether it was moved (False: the store refused,
        or the manifest had changed meanwhile). Its blob's chunks stay: other manifests
        (under any fingerprint) may share them, a republication overwrites them, and
        `prune` removes them once nothing references them. Only a node holding the
        cluster's key (warmd.store.keyproof) moves anything: another only counts it."""
        if not self.session.holds_cluster_key():
            self.reject(counter, fp, f"entry {name}", f"{why}; left in place (key proof "
                        f"{self.session.key_state()}: this node does not heal the store)")
            return False
        self.reject(counter, fp, f"entry {name}", f"{why}; quarantining it")
        value = layout.quarantine_note(raw, why, self.session.node)

        def run(client):
            return self.session.transport.script(
                "quarantine", client,
                keys=[layout.manifest_key(fp, name), layout.quarantine_key(fp, name),
                      layout.index_key(fp)],
                args=[raw, value, layout.QUARANTINE_TTL_MS, name])

        try:
            moved = bool(self.op(run, "quarantine"))
        except StoreFailed:
            return False
        if moved:
            self.count("quarantined", fp=fp)
        return moved


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


def _windows(reads: list[tuple], limit: int) -> Iterator[list[tuple]]:
    """(..., length) reads in windows whose lengths add up to at most limit (one read on
    its own when it is larger)."""
    window: list[tuple] = []
    size = 0
    for read in reads:
        if window and size + read[-1] > limit:
            yield window
            window, size = [], 0
        window.append(read)
        size += read[-1]
    if window:
        yield window


# What an adapter's install raises for the entry's content rather than this node's state:
# its own refusal, and JSON out of bounds or nested past Python's recursion limit from a
# library that parses it unbounded. Quarantined (counted unsafe_rejected), so no node
# fetches it again, never counted install_failed.
REFUSED_CONTENT = (UnsafeArtifact, boundedjson.JsonRefused, RecursionError)


def _refusal(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deep to read (RecursionError)"
    return str(exc)


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
