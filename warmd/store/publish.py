"""Publishing: pack a task's entries, write blobs then manifests (once per entry
cluster-wide), each entry's used key and the fingerprint's inputs, then the task's record.
Writes go through the narrow store interface (warmd.store.backend): this module knows no
Redis; the notice to nodes waiting on the task is StoreSharedCache's (its wake-ups)."""

from __future__ import annotations

import logging
import threading
import time

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.store import layout
from warmd.store.api import Publication, StoreFailed
from warmd.store.backend import KeyValueBackend, Put
from warmd.store.chunking import split_chunks
from warmd.store.fingerprint import Fingerprint
from warmd.store.formats import (
    Manifest,
    StoredTaskRecord,
    accept_manifest,
    accept_record,
    json_bytes,
    quarantine_note,
)
from warmd.store.session import Session, StaleRecords
from warmd.store.signing import sign
from warmd.store.validation import (
    WRONG_TYPE,
    BadRecord,
    RefusedHere,
    SignatureRefused,
    is_entry_name,
)

log = logging.getLogger("warmd.store")


class Publisher:
    def __init__(self, session: Session, stale: StaleRecords, backend: KeyValueBackend
                 ) -> None:
        self.session = session
        self.stale = stale  # cleared here: this node's record replaced it
        self.backend = backend
        self.count = session.stats.count
        # Entries this process published as they were built, or held back for the key
        # proof: their task's publication names them again, and counts them no second time.
        self._written: set[tuple[str, str]] = set()
        self._held_back: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # compile threads publish at once

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> Publication:
        return self._publish(adapter, entries, compile_seconds, task_key)

    def publish_entries(self, adapter: CacheAdapter, entries: list[CacheEntry],
                        compile_seconds: float) -> Publication:
        """Entries published the moment they are built (no task record: the task's own
        publication names them later)."""
        return self._publish(adapter, entries, compile_seconds, None)

    def _publish(self, adapter: CacheAdapter, entries: list[CacheEntry],
                 compile_seconds: float, task_key: str | None) -> Publication:
        """Pack and write the entries; given a task_key, the task's record after them (it
        replaces this node's stale record, and the counters may flush)."""
        fp = self._may_publish(adapter, entries, record=task_key is not None)
        if isinstance(fp, Publication):
            return fp
        packed = self._pack(adapter, fp, entries, compile_seconds)
        if packed is None:
            return Publication(skipped="an entry could not be packed")
        rec_raw = None
        if task_key is not None:
            rec = StoredTaskRecord(fp.digest, task_key, tuple(m.name for m, _ in packed),
                                   self.session.node, float(compile_seconds))
            rec_raw = json_bytes(sign(rec.to_json(), self.session.signing_key))
        try:
            new = self.write_entries(fp, packed)
            if task_key is not None:
                self._write_record(fp, task_key, rec_raw)
        except StoreFailed as failed:
            self._publish_failed(failed, fp.digest)
            return Publication(skipped=f"store {failed.kind}: {failed}")
        if task_key is not None:
            self.stale.clear(task_key)
        self._count_written(fp, packed, new, compile_seconds)
        if task_key is not None:
            self.session.stats.maybe_flush()
        return Publication(written=len(new), already_published=len(packed) - len(new))

    def _may_publish(self, adapter: CacheAdapter, entries: list[CacheEntry], record: bool
                     ) -> Fingerprint | Publication:
        """The fingerprint to publish these entries under (with a task record when record),
        or why nothing is published: no entries, no fingerprint, no store or a read-only
        one, or the key proof (counted)."""
        if not entries:
            return Publication(skipped="no entries")
        try:
            fp = self.session.fingerprint(adapter)
        except Exception as exc:  # the adapter could not describe itself
            return Publication(skipped=f"no fingerprint: {exc}")
        if self.session.backend.disabled_reason or self.session.read_only:
            self.count("publish_skipped", fp=fp.digest)
            return Publication(skipped=self.session.backend.disabled_reason or "read-only")
        blocked = self._blocked(fp, entries, record)
        return fp if blocked is None else blocked

    def _count_written(self, fp: Fingerprint, packed: list[tuple[Manifest, bytes]],
                       new: list[tuple[Manifest, bytes]], compile_seconds: float) -> None:
        """Count a publication: an entry found stored counts already_published only when
        another node stored it (not this process, as it was built)."""
        written = {(fp.digest, m.name) for m, _ in new}
        with self._lock:
            mine = written | self._written
            self._written |= written
        others = [m for m, _ in packed if (fp.digest, m.name) not in mine]
        self.count("published", len(new), fp.digest)
        self.count("already_published", len(others), fp.digest)
        self.count("bytes_published", sum(len(b) for _m, b in new), fp.digest)
        self.count("compile_seconds", float(compile_seconds), fp.digest)

    def _blocked(self, fp: Fingerprint, entries: list[CacheEntry], record: bool
                 ) -> Publication | None:
        """None when this node may publish now (warmd.store.keyproof: a keyed node claims a
        missing proof here); else the skipped publication, counted publish_blocked once per
        entry (and task record) held back: entries no node with the cluster's key would
        use, or a keyless node's in a signed cluster."""
        proof = self.session.key_state()
        if not proof.alarm:
            return None
        with self._lock:
            names = {(fp.digest, e.name) for e in entries} - self._held_back
            self._held_back |= names
        self.count("publish_blocked", len(names) + int(record), fp.digest)
        return Publication(skipped=f"key proof {proof}")

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
            if len(blob) > self.session.max_artifact_bytes or not is_entry_name(entry.name):
                self.count("publish_failed", fp=fp.digest)
                log.warning("shared cache: not publishing %s (%d bytes): too large or a bad "
                            "name", entry.name, len(blob))
                return None
            man = Manifest(adapter.library, entry.name, fp.digest, layout.sha256(blob),
                           len(blob), self.session.node, share, time.time())
            signed = sign(man.to_json(), self.session.signing_key)
            packed.append((Manifest(**signed), blob))
        return packed

    def write_entries(self, fp: Fingerprint, packed: list[tuple[Manifest, bytes]]
                      ) -> list[tuple[Manifest, bytes]]:
        """Blobs first (a manifest is never visible before its chunks), then manifests,
        then every entry's used key and the fingerprint's inputs. An entry another node
        published that verifies here is left alone; one this node refuses (undecodable,
        unsigned or badly signed, or a key of another Redis type) is quarantined and
        replaced when this node holds the cluster's key, else left alone. Returns the
        entries written."""
        found = self.backend.get_many([layout.manifest_key(fp.digest, m.name)
                                       for m, _ in packed])
        new, replaced = [], {}
        for (man, blob), raw in zip(packed, found, strict=True):
            if raw is None:
                new.append((man, blob))
            elif self._replaceable(fp.digest, man.name, raw, "entry"):
                new.append((man, blob))
                replaced[man.name] = raw
        ttl_ms = self.session.ttl_ms
        self.backend.put_many([Put(layout.blob_key(man.digest, i), chunk, ttl_ms)
                               for man, blob in new
                               for i, chunk in enumerate(split_chunks(blob, man.chunk_size))])
        fresh = [man for man, _blob in new if man.name not in replaced]
        stored = dict(zip((man.name for man in fresh), self.backend.put_many(
            [Put(layout.manifest_key(fp.digest, man.name), man.encode(), ttl_ms,
                 if_absent=True) for man in fresh]), strict=True))
        written = []
        for man, blob in new:
            key = layout.manifest_key(fp.digest, man.name)
            if man.name in replaced:
                self._swap(key, replaced[man.name], man.encode())
            elif not stored[man.name] \
                    and self._unreadable(fp.digest, key):  # (else published meanwhile)
                if not self._replaceable(fp.digest, man.name, WRONG_TYPE, "entry"):
                    continue
                self.backend.put(key, man.encode(), ttl_ms)
                replaced[man.name] = WRONG_TYPE
            written.append((man, blob))
        now = f"{time.time():.3f}".encode()
        self.backend.put_many([*(Put(layout.used_key(fp.digest, man.name), now)
                                 for man, _blob in packed),
                               Put(layout.fp_meta_key(fp.digest), json_bytes(fp.to_json()),
                                   ttl_ms)])
        for name, raw in replaced.items():
            self._note_replaced(fp.digest, name, raw)
        return written

    def _unreadable(self, fp: str, key: str) -> bool:
        """Whether key, which a write found taken, holds what the interface cannot read (on
        Redis, a key of another type): planted garbage, counted as refused."""
        if self.backend.get(key) is not None or self.backend.ttl_ms(key) is None:
            return False
        self.session.stats.count_refusal("corrupt_rejected", fp)
        log.warning("shared cache: refused %s (fingerprint %s): not a value warmd can read "
                    "(another Redis type)", key, fp)
        return True

    def _swap(self, key: str, old: bytes, new: bytes) -> bool:
        """Compare-and-set key from old to new; WRONG_TYPE (a key of another type, which no
        comparison matches) is replaced by a plain put while it still reads as nothing."""
        ttl_ms = self.session.ttl_ms
        if self.backend.compare_and_set(key, old, new, ttl_ms):
            return True
        if old != WRONG_TYPE or self.backend.get(key) is not None:
            return False
        return self.backend.put(key, new, ttl_ms)

    def _replaceable(self, fp: str, name: str, raw: bytes, what: str,
                     task: str | None = None) -> bool:
        """Whether a stored manifest (or, given task, task record) may be overwritten: it
        verifies here (a record being republished), or it is refused here and this node
        holds the cluster's key. One this node may not touch is counted."""
        try:
            if task is None:
                man = accept_manifest(raw, key=self.session.signing_key,
                                      max_size=1 << 62, fp=fp, name=name)
                return self._incompatible_here(fp, man)  # else published once, kept
            accept_record(raw, key=self.session.signing_key, fp=fp, task=task)
            return True
        except RefusedHere:
            return False  # e.g. a newer format: not ours to judge
        except BadRecord as exc:
            if isinstance(exc, SignatureRefused) and exc.other_key:
                self.session.cluster_key.note_other_key()
            if self.session.holds_cluster_key():
                return True
            self.count("publish_blocked", fp=fp)
            log.warning("shared cache: not replacing %s %s (fingerprint %s), refused here "
                        "(%s): this node's signing key is not the cluster's", what, name, fp,
                        exc)
            return False

    def _incompatible_here(self, fp: str, man: Manifest) -> bool:
        """Whether a valid entry is one this process could not install (a build that does
        not work here, warmd.cache.base.IncompatibleHere): its own build then replaces it,
        with the cluster's key, so nodes like this one share theirs (`replaced`; nodes of
        each kind alternating means the fingerprint misses an input that tells them apart)."""
        if (fp, man.name, man.digest) not in self.session.incompatible_here:
            return False
        return self.session.holds_cluster_key()

    def _note_replaced(self, fp: str, name: str, raw: bytes) -> None:
        """Keep what a replacement overwrote under the quarantine key, for operators."""
        note = quarantine_note(raw, "refused here; replaced by a verified publish",
                               self.session.node)
        try:
            self.backend.put(layout.quarantine_key(fp, name), note, layout.QUARANTINE_TTL_MS)
        except StoreFailed:
            return
        self.count("replaced", fp=fp)

    def _write_record(self, fp: Fingerprint, task: str, rec_raw: bytes) -> None:
        """Write the task's record unless a record this node may not replace is there
        (StoreSharedCache then announces the publication either way: waiters look
        again)."""
        key = layout.task_key(fp.digest, task)
        old = self.backend.get(key)
        if old is not None:
            if self._replaceable(fp.digest, task, old, "task record", task):
                self._swap(key, old, rec_raw)
        elif not self.backend.compare_and_set(key, None, rec_raw, self.session.ttl_ms) \
                and self._unreadable(fp.digest, key) \
                and self._replaceable(fp.digest, task, WRONG_TYPE, "task record", task):
            self._swap(key, WRONG_TYPE, rec_raw)

    def _publish_failed(self, failed: StoreFailed, fp: str) -> None:
        if failed.kind == "denied":
            self.count("publish_denied", fp=fp)
            self.session.note_read_only(failed)
            return
        self.count("publish_failed", fp=fp)
        if failed.kind in ("oom", "readonly"):
            why = ("out of memory: see docs/redis.md on maxmemory" if failed.kind == "oom"
                   else "read-only replica")
            self.session.warn_once(failed.kind, "shared cache %s cannot store new entries "
                                   "(%s); warmup continues, results stay local",
                                   self.session.backend.display_url, why)
