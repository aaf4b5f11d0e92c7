"""The store's two record types, manifests and task records: canonical JSON
(``json_bytes``), each encoded, decoded through the bounded decoder, and accepted for one
fingerprint and name or task (signature checked); what a quarantine key holds."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Self

from warmd.store.chunking import CHUNK_SIZE, chunk_count
from warmd.store.signing import check as check_signature
from warmd.store.validation import (
    HEX64,
    MAX_BLOB_BYTES,
    MAX_TASK_ENTRIES,
    BadRecord,
    Fields,
    RefusedHere,
    SignatureRefused,
    is_entry_name,
    load_record,
)


def json_bytes(obj: dict) -> bytes:
    """Canonical JSON (sorted keys, no spaces): what every record is stored as."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class StoredRecord:
    """What every stored record (a dataclass) shares: its JSON, tuples as lists and no "sig"
    while unsigned, stored as canonical bytes."""

    def to_json(self) -> dict:
        data = {name: list(value) if isinstance(value, tuple) else value
                for name, value in asdict(self).items()}
        if "sig" in data and data["sig"] is None:
            del data["sig"]
        return data

    def encode(self) -> bytes:
        return json_bytes(self.to_json())


class ArtifactRecord(StoredRecord):
    """A record of one stored artifact (a manifest, a pending claim): its chunks, and what its
    decoding checks besides each field's bounds."""

    name: str
    digest: str
    size: int
    chunk_size: int
    v: int

    @property
    def chunks(self) -> int:
        return chunk_count(self.size, self.chunk_size)

    def checked(self, kind: str, max_size: int) -> Self:
        """This record if it is of version 1 and names an entry and a digest; raises
        RefusedHere (another version, or over this node's size limit) or BadRecord."""
        if self.v != 1:
            raise RefusedHere(f"unknown {kind} version {self.v}")
        if not is_entry_name(self.name) or not HEX64.match(self.digest):
            raise BadRecord(f"malformed {kind}: name or digest")
        if self.size > max_size:
            raise RefusedHere(f"{kind} size {self.size} is over this node's {max_size}-byte "
                              "limit")
        return self


@dataclass(frozen=True)
class Manifest(ArtifactRecord):
    library: str
    name: str
    fingerprint: str
    digest: str
    size: int
    producer: str
    compile_seconds: float
    created: float
    chunk_size: int = CHUNK_SIZE
    v: int = 1
    sig: str | None = field(default=None, compare=False)

    @classmethod
    def decode(cls, raw: bytes | str, max_size: int) -> Manifest:
        """Parse and check a stored manifest; raises BadRecord on anything off."""
        f = Fields(load_record(raw), "manifest")
        return cls(f.text("library"), f.text("name"), f.text("fingerprint"), f.text("digest"),
                   f.integer("size", 0, MAX_BLOB_BYTES), f.text("producer", ""),
                   f.number("compile_seconds", 0.0, low=0.0), f.number("created", 0.0, low=0.0),
                   f.integer("chunk_size", 64 << 10, 64 << 20, CHUNK_SIZE),
                   f.integer("v", 0, 1 << 31, 1), f.signature()).checked("manifest", max_size)


@dataclass(frozen=True)
class StoredTaskRecord(StoredRecord):
    """What the store keeps per (fingerprint, task): the entries one plan task produced
    (the local record of a task is warmd.cache's)."""

    fingerprint: str
    task: str
    entries: tuple[str, ...]
    producer: str
    compile_seconds: float
    created: float = field(default_factory=time.time)
    v: int = 1
    sig: str | None = field(default=None, compare=False)

    @classmethod
    def decode(cls, raw: bytes | str) -> StoredTaskRecord:
        f = Fields(load_record(raw), "task record")
        entries = f.value("entries", list)
        if not 0 < len(entries) <= MAX_TASK_ENTRIES or not all(is_entry_name(e)
                                                                for e in entries):
            # an empty list would settle the task with nothing installed
            raise BadRecord("malformed task record: entries must be a list of 1 to "
                            f"{MAX_TASK_ENTRIES} entry names")
        if len(set(entries)) != len(entries):
            raise BadRecord("inconsistent task record: an entry is named twice")
        rec = cls(f.text("fingerprint"), f.text("task"), tuple(entries), f.text("producer", ""),
                  f.number("compile_seconds", 0.0, low=0.0), f.number("created", 0.0, low=0.0),
                  f.integer("v", 0, 1 << 31, 1), f.signature())
        if rec.v != 1:
            raise BadRecord(f"unknown task record version {rec.v}")
        return rec


def accept_manifest(raw: bytes, *, key: bytes | None, max_size: int, fp: str, name: str,
                    library: str | None = None) -> Manifest:
    """The manifest stored for (fp, name) if it may be used; raises BadRecord (corrupt or
    describing another entry) or SignatureRefused."""
    man = Manifest.decode(raw, max_size)
    refused = check_signature(man.to_json(), key)
    if refused:
        raise SignatureRefused(refused)
    if (man.name, man.fingerprint) != (name, fp) or (library and man.library != library):
        raise BadRecord("manifest describes another entry")
    return man


def accept_record(raw: bytes, *, key: bytes | None, fp: str, task: str) -> StoredTaskRecord:
    """The task record stored for (fp, task) if it may be used; raises like accept_manifest."""
    rec = StoredTaskRecord.decode(raw)
    refused = check_signature(rec.to_json(), key)
    if refused:
        raise SignatureRefused(refused)
    if rec.fingerprint != fp or rec.task != task:
        raise BadRecord("record names another task or fingerprint")
    return rec


def quarantine_note(raw: bytes, why: str, node: str) -> bytes:
    """What a quarantine key holds: the refused manifest (or a prefix of its bytes), why,
    who moved it aside and when."""
    try:
        note = load_record(raw)
    except BadRecord:
        note = {"raw": repr(raw[:200])}
    return json_bytes({"manifest": note, "reason": why, "node": node, "at": time.time()})
