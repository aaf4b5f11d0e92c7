"""The pending tier: entries captured on serving nodes, held apart until a trusted producer
re-derives them (warmd.capture, warmd.rederive).

A capture is an artifact and a record (PendingCapture) under keys of its own
(``claim:``, ``claimblob:``), its name in the fingerprint's index of captures (``captures:``,
a name index of warmd.store.json_values), never under a manifest, task record or learned
index: nothing a node installs reads them, and nothing here is signed. What a capture says is
read back through the store's bounded decoder and the artifact checked against the capture's
digest; whether the artifact is what the library builds is the re-derivation's question.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from warmd.cache.base import CacheAdapter
from warmd.store import json_values, layout
from warmd.store.api import SharedCaptures, StoreFailed
from warmd.store.backend import KeyValueBackend, Put
from warmd.store.chunking import CHUNK_SIZE, check_blob, chunk_lengths, split_chunks
from warmd.store.formats import ArtifactRecord
from warmd.store.session import Session
from warmd.store.validation import (
    MAX_BLOB_BYTES,
    MAX_TEXT,
    BadRecord,
    Fields,
    is_entry_name,
    load_record,
)

log = logging.getLogger("warmd.store")

MAX_PENDING_LISTED = 1000  # captures one listing returns (oldest first): a bounded read
MAX_PENDING_INDEXED = 4 * MAX_PENDING_LISTED  # names the index keeps (the newest)
MAX_CAPTURE_PLANS = 64  # plans one capture names (a node warms a handful of models)


@dataclass(frozen=True)
class PendingCapture(ArtifactRecord):
    """What a serving node says it captured (warmd.capture): an entry's artifact, its digest,
    the node and the plans it learned it for. Never signed and never installed: a trusted
    producer re-derives it (warmd.rederive) and publishes what it built itself."""

    library: str
    name: str
    fingerprint: str
    digest: str
    size: int
    node: str
    plans: tuple[str, ...]
    compile_seconds: float = 0.0
    created: float = field(default_factory=time.time)
    chunk_size: int = CHUNK_SIZE
    v: int = 1

    @classmethod
    def decode(cls, raw: bytes | str, max_size: int) -> PendingCapture:
        """Parse and check a stored capture; raises BadRecord (RefusedHere when over this
        node's size limit)."""
        f = Fields(load_record(raw), "capture")
        plans = f.value("plans", list)
        if not plans or len(plans) > MAX_CAPTURE_PLANS or not all(
                isinstance(p, str) and 0 < len(p) <= MAX_TEXT for p in plans):
            raise BadRecord(f"malformed capture: plans must be 1 to {MAX_CAPTURE_PLANS} strings")
        return cls(f.text("library"), f.text("name"), f.text("fingerprint"), f.text("digest"),
                   f.integer("size", 0, MAX_BLOB_BYTES), f.text("node", ""), tuple(plans),
                   f.number("compile_seconds", 0.0), f.number("created", 0.0),
                   f.integer("chunk_size", 64 << 10, 64 << 20, CHUNK_SIZE),
                   f.integer("v", 0, 1 << 31, 1)).checked("capture", max_size)


class PendingCaptures(SharedCaptures):
    """The cache's pending tier (SharedCaptures)."""

    def __init__(self, session: Session, backend: KeyValueBackend) -> None:
        self.session, self.backend = session, backend

    def submit(self, adapter: CacheAdapter, plans: list[str], name: str, artifact: bytes,
               compile_seconds: float = 0.0) -> bool:
        """Store a capture (artifact chunks first, then its record, then its name in the
        index); True when the store took it. A capture already there is replaced (nodes
        capturing one entry at once write the same thing)."""
        if self.session.read_only or not is_entry_name(name):
            return False
        if len(artifact) > self.session.max_artifact_bytes:
            return False
        try:
            fp = self.session.fingerprint(adapter).digest
        except Exception:  # the adapter could not describe itself: nothing to file it under
            return False
        capture = PendingCapture(adapter.library, name, fp, layout.sha256(artifact),
                                 len(artifact), self.session.node,
                                 tuple(plans[:MAX_CAPTURE_PLANS]), float(compile_seconds))
        ttl = self.session.ttl_ms
        try:
            self.backend.put_many([Put(layout.capture_blob_key(fp, name, i), chunk, ttl)
                                   for i, chunk in enumerate(split_chunks(artifact,
                                                                          capture.chunk_size))])
            self.backend.put(layout.capture_key(fp, name), capture.encode(), ttl)
            return json_values.add_names(self.backend, layout.captures_key(fp),
                                         {name: time.time()}, MAX_PENDING_INDEXED, ttl)
        except StoreFailed as failed:
            if failed.kind == "denied":
                self.session.note_read_only(failed)
            return False

    def pending(self, adapter: CacheAdapter) -> list[str]:
        """The pending captures of the adapter's fingerprint, oldest first (at most
        MAX_PENDING_LISTED); empty when none or unreachable."""
        try:
            key = layout.captures_key(self.session.fingerprint(adapter).digest)
            raw = self.backend.get(key)
        except StoreFailed:
            return []
        except Exception as exc:  # an adapter without fingerprint
            log.warning("shared cache: cannot list pending captures of %s: %s",
                        adapter.library, exc)
            return []
        listed = json_values.oldest_first(json_values.read_index(raw))
        return [n for n in listed if is_entry_name(n)][:MAX_PENDING_LISTED]

    def read(self, adapter: CacheAdapter, name: str) -> tuple[PendingCapture, bytes] | None:
        """The capture and its artifact, each checked (bounded record, the artifact's chunk
        lengths and digest); None when unreachable. Raises BadRecord for a capture that has
        no record, is malformed or does not match its artifact (the caller drops it)."""
        fp = self.session.fingerprint(adapter).digest
        try:
            raw = self.backend.get(layout.capture_key(fp, name))
        except StoreFailed:
            return None
        if raw is None:  # a name in the index whose record expired, was never written (the
            # record is written before the name) or is a key of another type: dropped, never
            # kept in the oldest MAX_PENDING_LISTED, where names alone could hold real
            # captures out for good
            raise BadRecord(f"capture {name} has no record (expired, only its name was "
                            "planted, or not a string value)")
        capture = PendingCapture.decode(raw, self.session.max_artifact_bytes)
        if (capture.name, capture.fingerprint, capture.library) != (name, fp, adapter.library):
            raise BadRecord(f"capture {name} describes another entry")
        # one byte past each chunk's length: an oversized chunk is seen, never read whole
        reads = [(layout.capture_blob_key(fp, name, i), length + 1)
                 for i, length in enumerate(chunk_lengths(capture))]
        try:
            chunks = self.backend.get_prefixes(reads)
        except StoreFailed:
            return None
        return capture, check_blob(capture, chunks)

    def drop(self, adapter: CacheAdapter, name: str, chunks: int = 0) -> bool:
        """Remove a capture (re-derived, or refused): its record, chunks and index entry."""
        try:
            fp = self.session.fingerprint(adapter).digest
        except Exception:
            return False
        try:
            self.backend.delete([layout.capture_key(fp, name),
                                 *[layout.capture_blob_key(fp, name, i)
                                   for i in range(max(chunks, 1))]])
            return json_values.remove_names(self.backend, layout.captures_key(fp), [name],
                                            self.session.ttl_ms)
        except StoreFailed:
            return False
