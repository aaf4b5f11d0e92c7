"""Reading entries: task records, manifests and blobs, each verified (layout's decoders,
signatures, digests) before an adapter installs it; bad entries quarantined, entries this
node cannot use left alone."""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from warmd import boundedjson, settings
from warmd.cache.base import CacheAdapter, IncompatibleHere, UnsafeArtifact
from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import classify
from warmd.store.fingerprint import Fingerprint
from warmd.store.layout import BadRecord, Manifest, StoredTaskRecord
from warmd.store.session import Session, StaleRecords
from warmd.store.signing import check as check_signature

log = logging.getLogger("warmd.store")

BLOB_BATCH_BYTES = 64 << 20  # bound on blob bytes held in memory during a prefetch
INSTALL_THREADS = 8


class Entries:
    def __init__(self, session: Session, stale: StaleRecords) -> None:
        self.session = session
        self.stale = stale  # written here: records found but not usable
        self.op = session.transport.op
        self.count = session.stats.count
        # (library, entry) -> compile seconds its manifest recorded, for what this process
        # installed: the warmup's saved time and the node's task record take them.
        self.installed: dict[tuple[str, str], float] = {}

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        """SharedCache.prefetch in a few pipelined round trips: task records, then
        manifests, then blobs (in batches of at most 64 MiB)."""
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
        try:
            with self._timed("fetch_seconds", fp.digest):
                records = self._read_records(fp.digest, tasks)
                present = {e.name for e in adapter.list_entries()}
                named = {n for rec, _raw in records.values() for n in rec.entries}
                manifests = self._read_manifests(fp, sorted(named - present), list(records))
            installed = self._fetch_and_install(adapter, fp.digest, manifests)
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

    # -- task records and manifests --------------------------------------------------------

    def _get(self, keys: list[str]) -> list:
        """GET each key in one round trip: the replies, errors left in place. Nothing is
        touched here: only what verifies has its TTL renewed (touch)."""
        def run(client):
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            return pipe.execute(raise_on_error=False)

        return self.op(run, "fetch") if keys else []

    def touch(self, keys: list[str], extra=None) -> None:
        """PEXPIRE (the TTL refresh of a use) of keys that verified, plus extra(pipe); best
        effort (a read-only user may not)."""
        def run(client):
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.pexpire(key, self.session.ttl_ms)
            if extra is not None:
                extra(pipe)
            return pipe.execute(raise_on_error=False)

        if keys or extra is not None:
            with contextlib.suppress(StoreFailed):
                self.op(run, "touch")

    def _read_records(self, fp: str, tasks: list[str]) -> dict[str, tuple[StoredTaskRecord, bytes]]:
        replies = self._get([layout.task_key(fp, task) for task in tasks])
        out = {}
        for task, reply in zip(tasks, replies, strict=True):
            raw = self._string(reply)
            if raw is None:
                continue
            try:
                out[task] = (layout.accept_record(raw, key=self.session.signing_key, fp=fp,
                                                  task=task), raw)
            except BadRecord as exc:
                self.stale.note(task, raw)  # not a publication: the lease is still taken
                self.reject(exc.counter, fp, f"task record {task}", str(exc))
        return out

    def _read_manifests(self, fp: Fingerprint, names: list[str], records: list[str]
                        ) -> dict[str, tuple]:
        """name -> (Manifest, raw) for every acceptable manifest; the others are counted.
        The accepted ones, and the task records named in `records`, are then touched."""
        replies = self._get([layout.manifest_key(fp.digest, n) for n in names])
        out = {}
        for name, reply in zip(names, replies, strict=True):
            raw = self._string(reply)
            if raw is None:
                continue
            man = self._accept_manifest(fp, name, raw)
            if man is not None:
                out[name] = (man, raw)

        def touch_index(pipe) -> None:
            if out:
                pipe.zadd(layout.index_key(fp.digest), dict.fromkeys(out, time.time()),
                          xx=True)
            pipe.zadd(layout.FPS_KEY, {fp.digest: time.time()})
            pipe.pexpire(layout.fp_meta_key(fp.digest), self.session.ttl_ms)

        self.touch([layout.task_key(fp.digest, t) for t in records]
                   + [layout.manifest_key(fp.digest, n) for n in out],
                   touch_index if records or out else None)
        return out

    def _string(self, reply) -> bytes | None:
        """A GET reply; a key of another Redis type (WRONGTYPE) reads as layout.WRONG_TYPE,
        which no decoder accepts; other errors raise StoreFailed."""
        if isinstance(reply, Exception) and classify(reply) == "error":
            return layout.WRONG_TYPE
        return self.session.transport.checked(reply, "fetch")

    def _accept_manifest(self, fp: Fingerprint, name: str, raw: bytes) -> Manifest | None:
        try:
            return layout.accept_manifest(raw, key=self.session.signing_key,
                                          max_size=self.session.max_artifact_bytes, fp=fp.digest,
                                          name=name, library=fp.library)
        except layout.RefusedHere as exc:
            self.refused_here(fp.digest, name, str(exc))
        except BadRecord as exc:
            self.refuse_entry(fp.digest, name, raw, exc)
        return None

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

    # -- blobs -----------------------------------------------------------------------------

    def _fetch_and_install(self, adapter: CacheAdapter, fp: str,
                           manifests: dict[str, tuple]) -> set[str]:
        """Read and verify blobs batch by batch; install the good ones in a few threads
        (installs wait on fsync, so they overlap well)."""
        installed: set[str] = set()

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
                    blobs = self.read_blobs([man for man, _raw in batch])
                with self._timed("install_seconds", fp):
                    jobs = [pool.submit(one, man, raw, blobs.get(man.digest))
                            for man, raw in batch]
                    for job in jobs:
                        job.result()
        return installed

    def read_blobs(self, manifests: list[Manifest]) -> dict[str, bytes | BadRecord]:
        """digest -> the verified blob, or the BadRecord saying why it is not usable. Each
        chunk is read with GETRANGE up to one byte past its declared length, so what comes
        back is bounded by the manifests' sizes whatever the store holds; only the chunks
        of verified blobs have their TTL renewed."""
        unique = list({man.digest: man for man in manifests}.values())

        def run(client):
            pipe = client.pipeline(transaction=False)
            for man in unique:
                for i, length in enumerate(layout.chunk_lengths(man)):
                    pipe.getrange(layout.blob_key(man.digest, i), 0, length)
            return pipe.execute(raise_on_error=False)

        replies = self.op(run, "fetch") if unique else []
        out: dict[str, bytes | BadRecord] = {}
        verified: list[str] = []
        at = 0
        for man in unique:
            count = man.chunks
            chunks, replies[at:at + count] = replies[at:at + count], [None] * count
            at += count
            out[man.digest] = self._verified_blob(man, chunks)
            if not isinstance(out[man.digest], BadRecord):
                verified += [layout.blob_key(man.digest, i) for i in range(count)]
        self.touch(verified)
        return out

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
        limit = min(self.session.max_artifact_bytes, settings.max_artifact_bytes())
        if unpacks_over(blob, limit):
            self.refused_here(fp, man.name, f"unpacks to more than this node's {limit}-byte "
                              "limit", man.digest)
            return False
        try:
            adapter.install(man.name, blob)
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
