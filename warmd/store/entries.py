"""Reading entries: task records, manifests and blobs, each verified (layout's decoders,
signatures, digests) before an adapter installs it; bad entries quarantined, entries this
node cannot use left alone (``refusals.py``).

Reads go through the narrow store interface (warmd.store.backend): this module knows no
Redis. They are bounded and stay reads: every round trip holds at most READ_WINDOW_BYTES of
blob chunks (``blobs.py``) or KEYS_PER_WINDOW records, so a thousand nodes joining at once
cost the server a bounded reply buffer each; what verified has its TTL renewed at most once per
RENEW interval per plan across the cluster (``renewal.py``: one node wins a marker and
renews for all); with replica reads on, what a replica answered as absent or refused is
asked again of the primary before it counts, so replica lag never quarantines a valid entry.
Given peers (warmd.cluster.fanout), blobs come from other nodes first, verified exactly like
the store's."""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

from warmd import boundedjson, settings
from warmd.cache.base import CacheAdapter, CacheEntry, IncompatibleHere, UnsafeArtifact
from warmd.cache.install import TooLargeHere, install_batch
from warmd.store import layout
from warmd.store.api import Publication, SharedEntries, StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.blobs import Blobs
from warmd.store.chunking import size_batches
from warmd.store.fingerprint import Fingerprint
from warmd.store.formats import Manifest, StoredTaskRecord, accept_manifest, accept_record
from warmd.store.publish import Publisher
from warmd.store.refusals import Refusals
from warmd.store.renewal import Renewal, Used
from warmd.store.session import Session, StaleRecords
from warmd.store.validation import BadRecord, RefusedHere
from warmd.store.wakeups import WakeUps

log = logging.getLogger("warmd.store")

BLOB_BATCH_BYTES = 64 << 20  # bound on blob bytes held in memory during a prefetch
KEYS_PER_WINDOW = 128  # records or manifests one round trip asks for
INSTALL_THREADS = 8


class Entries(SharedEntries):
    """The cache's entries (SharedEntries): fetched here, published by `publisher` (its
    waiters woken through `wakeups`). backend: the store; replicas: the same store read
    from replicas that may lag (None: reads go to backend), whose misses and refusals are
    read again from backend. A key the interface cannot read (on Redis, of another type)
    reads as absent: a miss, never installed; the publication that meets it replaces it
    (publish.py)."""

    def __init__(self, session: Session, stale: StaleRecords, refusals: Refusals,
                 blobs: Blobs, backend: KeyValueBackend, publisher: Publisher,
                 wakeups: WakeUps, replicas: KeyValueBackend | None = None) -> None:
        self.session = session
        self.publisher, self.wakeups = publisher, wakeups
        self.stale = stale  # written here: records found but not usable
        self.refusals = refusals
        self.blobs = blobs
        self.backend = backend
        self.replicas = replicas
        self.renewal = Renewal(session)
        self.count = session.stats.count
        # (library, entry) -> compile seconds its manifest recorded, for what this process
        # installed: the warmup's saved time and the node's task record take them.
        self.installed: dict[tuple[str, str], float] = {}

    def fetch_task(self, adapter: CacheAdapter, task_key: str) -> list[str] | None:
        return self.prefetch(adapter, [task_key]).get(task_key)

    def installed_seconds(self, library: str, name: str) -> float | None:
        return self.installed.get((library, name))

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> Publication:
        publication = self.publisher.publish_task(adapter, task_key, entries, compile_seconds)
        fp = self.session.digest(adapter)
        if publication.skipped is None and fp is not None:
            # wake the nodes waiting on the task (best effort: they wait a bounded time)
            self.wakeups.notify({layout.channel(fp, task_key): b"published"})
        return publication

    def publish_entries(self, adapter: CacheAdapter, entries: list[CacheEntry],
                        compile_seconds: float) -> Publication:
        return self.publisher.publish_entries(adapter, entries, compile_seconds)

    def install_entries(self, adapter: CacheAdapter, names: list[str]) -> list[str]:
        try:
            fp = self.session.fingerprint(adapter)
            present = {e.name for e in adapter.list_entries()}
            wanted = sorted(set(names) - present)
            installed = self.install_named(adapter, fp, wanted) if wanted else set()
        except StoreFailed:
            return []
        except Exception as exc:  # a bug or an unforeseen value: a miss, never a failure
            self.count("fetch_failed")
            log.warning("shared cache: installing %s entries failed (%s: %s)",
                        adapter.library, type(exc).__name__, exc)
            return []
        return sorted((set(names) & present) | installed)

    def prefetch(self, adapter: CacheAdapter, task_keys: Iterable[str]
                 ) -> dict[str, list[str] | None]:
        """SharedEntries.prefetch in bounded round trips: task records, then
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
        self.renewal.renew(used, tasks)
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

    @staticmethod
    def _get(store: KeyValueBackend, keys: list[str]) -> list[bytes | None]:
        """Each key's value, KEYS_PER_WINDOW per round trip. Nothing is touched here: only
        what verifies has its TTL renewed (renew)."""
        values: list[bytes | None] = []
        for at in range(0, len(keys), KEYS_PER_WINDOW):
            values += store.get_many(keys[at:at + KEYS_PER_WINDOW])
        return values

    def _read_checked(self, keys: list[str], check: Callable[[int, bytes], object]) -> list:
        """check(i, raw) for each key's value (None where it is absent). With replica reads,
        every key a replica answered as absent, or whose value check refused (a BadRecord),
        is read again from the primary and checked again: a lagging replica is no refusal
        and no miss."""
        results = [None if raw is None else check(i, raw)
                   for i, raw in enumerate(self._get(self.replicas or self.backend, keys))]
        again = [i for i, r in enumerate(results) if r is None or isinstance(r, BadRecord)]
        if self.replicas is not None and again:
            fresh = self._get(self.backend, [keys[i] for i in again])
            for i, raw in zip(again, fresh, strict=True):
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
                return accept_record(raw, key=self.session.signing_key, fp=fp,
                                     task=tasks[i])
            except BadRecord as exc:
                return exc

        out = {}
        keys = [layout.task_key(fp, task) for task in tasks]
        for i, found in enumerate(self._read_checked(keys, check)):
            if isinstance(found, BadRecord):
                self.stale.note(tasks[i], raws[i])  # not a publication: the lease is taken
                self.refusals.reject(found.counter, fp, f"task record {tasks[i]}", str(found))
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
                return accept_manifest(raw, key=self.session.signing_key,
                                       max_size=self.session.max_artifact_bytes,
                                       fp=fp.digest, name=names[i], library=fp.library)
            except RefusedHere as exc:
                return exc
            except BadRecord as exc:
                return exc

        keys = [layout.manifest_key(fp.digest, n) for n in names]
        out = {}
        for i, found in enumerate(self._read_checked(keys, check)):
            if isinstance(found, RefusedHere):
                self.refusals.refused_here(fp.digest, names[i], str(found))
            elif isinstance(found, BadRecord):
                self.refusals.refuse_entry(fp.digest, names[i], raws[i], found)
            elif found is not None:
                out[names[i]] = (found, raws[i])
        return out

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
        self.renewal.renew(used, sorted(manifests))
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
                self.refusals.quarantine(fp, man.name, raw, str(blob))
            elif blob is not None and self._install(adapter, fp, man, raw, blob):
                installed.add(man.name)

        wanted = [(man, raw) for man, raw in manifests.values()
                  if (fp, man.name, man.digest) not in self.session.refused_entries]
        with ThreadPoolExecutor(INSTALL_THREADS, thread_name_prefix="warmd-install") as pool:
            for batch in size_batches(wanted, BLOB_BATCH_BYTES):
                with self._timed("fetch_seconds", fp):
                    blobs = self.blobs.fetch([man for man, _raw in batch], fp, used)
                with self._timed("install_seconds", fp), install_batch():
                    context = copy_context()
                    jobs = [pool.submit(context.copy().run, one, man, raw,
                                        blobs.get(man.digest)) for man, raw in batch]
                    for job in jobs:
                        job.result()
        return installed

    def _install(self, adapter: CacheAdapter, fp: str, man: Manifest, raw: bytes,
                 blob: bytes) -> bool:
        limit = self.session.max_artifact_bytes
        if limit < settings.max_artifact_bytes() and unpacks_over(blob, limit):
            # (the adapter checks the node-wide limit itself, in the one pass that unpacks)
            self.refusals.refused_here(fp, man.name, f"unpacks to more than this node's "
                                       f"{limit}-byte limit", man.digest)
            return False
        try:
            adapter.install(man.name, blob)
        except TooLargeHere as exc:  # this node's own limit: the entry works elsewhere
            self.refusals.refused_here(fp, man.name, str(exc), man.digest)
            return False
        except IncompatibleHere as exc:
            self.refusals.refused_here(fp, man.name, str(exc), man.digest, replaceable=True)
            return False
        except REFUSED_CONTENT as exc:  # what the entry holds, not this node: for everyone
            self.refusals.quarantine(fp, man.name, raw, f"unsafe artifact: {_refusal(exc)}",
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
