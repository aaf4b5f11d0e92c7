"""The store's key layout (versioned prefix warmd:v1:) and its two record types.

Keys that must live together in Redis Cluster share a hash tag: every chunk of one blob
({digest}), and everything of one fingerprint ({fp}: manifests, index, task records, leases).

    warmd:v1:blob:{<sha256>}:<i>      chunk i of a content-addressed blob (1 MiB chunks)
    warmd:v1:man:{<fp>}:<name>        manifest of one entry (JSON, optionally signed)
    warmd:v1:idx:{<fp>}               ZSET entry name -> last use (unix time)
    warmd:v1:task:{<fp>}:<task key>   task record: the entries one plan task produced
    warmd:v1:lease:{<fp>}:<task key>  single-flight lease (SET NX PX, renewed)
    warmd:v1:pub:{<fp>}:<task key>    pub/sub channel announcing a task's publication
    warmd:v1:quar:{<fp>}:<name>       a quarantined manifest with the reason
    warmd:v1:fp:{<fp>}                the fingerprint's inputs (JSON), for humans
    warmd:v1:fps                      ZSET fingerprint -> last use
    warmd:v1:stats:node:<node>        HASH of counters per node
    warmd:v1:stats:fp:{<fp>}          HASH of counters per fingerprint
    warmd:v1:stats:nodes              SET of node names
    warmd:v1:nodes:<ns>:<node id>     the daemon's JSON node record (expires unless rewritten)
    warmd:v1:nodes:<ns>               SET of node ids with a record
    warmd:v1:daemon:<ns>              JSON: the running controller's config summary
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from warmd.store.signing import check as check_signature

PREFIX = "warmd:v1:"
CHUNK_SIZE = 1 << 20
FPS_KEY = f"{PREFIX}fps"
NODES_KEY = f"{PREFIX}stats:nodes"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254}$")


def blob_key(digest: str, index: int) -> str:
    return f"{PREFIX}blob:{{{digest}}}:{index}"


def manifest_key(fp: str, name: str) -> str:
    return f"{PREFIX}man:{{{fp}}}:{name}"


def index_key(fp: str) -> str:
    return f"{PREFIX}idx:{{{fp}}}"


def task_key(fp: str, task: str) -> str:
    return f"{PREFIX}task:{{{fp}}}:{task}"


def learned_key(fp: str, plan: str) -> str:
    """The set of entries captured on nodes running a plan (names; each entry has its own
    signed task record, so this index only says what to fetch)."""
    return f"{PREFIX}learned:{{{fp}}}:{plan}"


def lease_key(fp: str, task: str) -> str:
    return f"{PREFIX}lease:{{{fp}}}:{task}"


def channel(fp: str, task: str) -> str:
    return f"{PREFIX}pub:{{{fp}}}:{task}"


def quarantine_key(fp: str, name: str) -> str:
    return f"{PREFIX}quar:{{{fp}}}:{name}"


def fp_meta_key(fp: str) -> str:
    return f"{PREFIX}fp:{{{fp}}}"


def node_stats_key(node: str) -> str:
    return f"{PREFIX}stats:node:{node}"


def fp_stats_key(fp: str) -> str:
    return f"{PREFIX}stats:fp:{{{fp}}}"


def nodes_key(namespace: str) -> str:
    return f"{PREFIX}nodes:{namespace}"


def node_key(namespace: str, node_id: str) -> str:
    return f"{PREFIX}nodes:{namespace}:{node_id}"


def daemon_key(namespace: str) -> str:
    return f"{PREFIX}daemon:{namespace}"


class BadRecord(ValueError):
    """A manifest, task record or blob that is malformed, mismatched or corrupt."""

    counter = "corrupt_rejected"


class RefusedHere(BadRecord):
    """Well formed perhaps, but not usable by this reader (over its size limit, a version it
    does not know): a miss here, never grounds to quarantine what other nodes can use."""

    counter = "refused_here"


class SignatureRefused(BadRecord):
    """Unsigned or badly signed while a signing key is configured."""

    counter = "signature_rejected"


def is_entry_name(name: object) -> bool:
    """A name that is safe as a directory name and a key suffix."""
    return isinstance(name, str) and bool(_NAME.match(name)) and ".." not in name


def json_bytes(obj: dict) -> bytes:
    """Canonical JSON (sorted keys, no spaces): what every record is stored as."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_count(size: int, chunk_size: int = CHUNK_SIZE) -> int:
    return max(1, -(-size // chunk_size))


def size_batches(items: list[tuple], limit: int = 64 << 20) -> Iterator[list[tuple]]:
    """(Manifest, ...) tuples in batches whose blobs add up to at most limit bytes (or one
    entry larger than that on its own)."""
    batch: list[tuple] = []
    size = 0
    for item in items:
        if batch and size + item[0].size > limit:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item[0].size
    if batch:
        yield batch


def split_chunks(blob: bytes, chunk_size: int = CHUNK_SIZE) -> list[bytes]:
    return [blob[i:i + chunk_size] for i in range(0, max(len(blob), 1), chunk_size)]


@dataclass(frozen=True)
class Manifest:
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

    @property
    def chunks(self) -> int:
        return chunk_count(self.size, self.chunk_size)

    def to_json(self) -> dict:
        data = asdict(self)
        if data["sig"] is None:
            del data["sig"]
        return data

    def encode(self) -> bytes:
        return json_bytes(self.to_json())

    @classmethod
    def decode(cls, raw: bytes | str, max_size: int) -> Manifest:
        """Parse and check a stored manifest; raises BadRecord on anything off."""
        data = load_record(raw)
        try:
            man = cls(str(data["library"]), data["name"], str(data["fingerprint"]),
                      str(data["digest"]), int(data["size"]), str(data.get("producer", "")),
                      float(data.get("compile_seconds", 0.0)), float(data.get("created", 0.0)),
                      int(data.get("chunk_size", CHUNK_SIZE)), int(data.get("v", 1)),
                      data.get("sig"))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRecord(f"malformed manifest: {exc}") from None
        if man.v != 1:
            raise RefusedHere(f"unknown manifest version {man.v}")
        if not is_entry_name(man.name) or not _HEX64.match(man.digest) or man.size < 0:
            raise BadRecord("malformed manifest: name, digest or size")
        if man.size > max_size:
            raise RefusedHere(f"manifest size {man.size} is over this node's {max_size}-byte "
                              "limit")
        if not (64 << 10) <= man.chunk_size <= (64 << 20):
            raise BadRecord(f"manifest chunk size {man.chunk_size} out of range")
        return man


@dataclass(frozen=True)
class TaskRecord:
    fingerprint: str
    task: str
    entries: tuple[str, ...]
    producer: str
    compile_seconds: float
    created: float = field(default_factory=time.time)
    v: int = 1
    sig: str | None = field(default=None, compare=False)

    def to_json(self) -> dict:
        data = asdict(self)
        data["entries"] = list(self.entries)
        if data["sig"] is None:
            del data["sig"]
        return data

    def encode(self) -> bytes:
        return json_bytes(self.to_json())

    @classmethod
    def decode(cls, raw: bytes | str) -> TaskRecord:
        data = load_record(raw)
        try:
            entries = data["entries"]
            if not isinstance(entries, list) or not all(is_entry_name(e) for e in entries):
                raise ValueError("entries must be a list of entry names")
            rec = cls(str(data["fingerprint"]), str(data["task"]), tuple(entries),
                      str(data.get("producer", "")), float(data.get("compile_seconds", 0.0)),
                      float(data.get("created", 0.0)), int(data.get("v", 1)), data.get("sig"))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRecord(f"malformed task record: {exc}") from None
        if rec.v != 1:
            raise BadRecord(f"unknown task record version {rec.v}")
        return rec


def load_record(raw: bytes | str) -> dict:
    """A JSON object from stored bytes; raises BadRecord otherwise."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRecord("record is not JSON") from None
    if not isinstance(data, dict):
        raise BadRecord("record is not a JSON object")
    return data


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


def accept_record(raw: bytes, *, key: bytes | None, fp: str, task: str) -> TaskRecord:
    """The task record stored for (fp, task) if it may be used; raises like accept_manifest."""
    rec = TaskRecord.decode(raw)
    refused = check_signature(rec.to_json(), key)
    if refused:
        raise SignatureRefused(refused)
    if rec.fingerprint != fp or rec.task != task:
        raise BadRecord("record names another task or fingerprint")
    return rec


def check_blob(man: Manifest, chunks: list[bytes | None]) -> bytes:
    """Join a blob's chunks and verify them against the manifest; raises BadRecord."""
    for i, chunk in enumerate(chunks):
        if chunk is None:
            raise BadRecord(f"missing chunk {i} of {len(chunks)}")
    blob = b"".join(chunks)  # type: ignore[arg-type]
    if len(blob) != man.size:
        raise BadRecord(f"truncated blob: {len(blob)} of {man.size} bytes")
    if sha256(blob) != man.digest:
        raise BadRecord("blob digest mismatch")
    return blob
