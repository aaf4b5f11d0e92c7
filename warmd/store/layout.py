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
    warmd:v1:keyproof                 HMAC of a constant under the cluster's signing key
    warmd:v1:store-id                 random id of this store (where unflushed stats spool)
    warmd:v1:stats:node:<node>        HASH of counters per node
    warmd:v1:stats:fp:{<fp>}          HASH of counters per fingerprint
    warmd:v1:stats:nodes              SET of node names
    warmd:v1:nodes:<ns>:<node id>     the daemon's JSON node record (expires unless rewritten)
    warmd:v1:nodes:<ns>               SET of node ids with a record
    warmd:v1:daemon:<ns>              JSON: the running controller's config summary
    warmd:v1:learned:{<fp>}:<plan>    ZSET of entries nodes captured for a plan (warmd.capture)
    warmd:v1:arrivals:<plan digest>   counter of nodes that began a plan (shard order)
    warmd:v1:claim:{<fp>}:<name>      a captured entry not re-derived yet (warmd.capture):
                                      JSON, never signed, never installed
    warmd:v1:claimblob:{<fp>}:<name>:<i>  chunk i of that claim's artifact
    warmd:v1:claims:{<fp>}            ZSET claim name -> when it was (last) claimed
    warmd:v1:renewed:<fp>:<plan>      marker: a node renewed the TTLs of what this plan uses
                                      (no hash tag: spread over a cluster's shards)
    warmd:v1:klease:{<fp>}:<entry>    claim on one entry being compiled (short PX, renewed)
    warmd:v1:kpub:{<fp>}              pub/sub channel: a claim of this fingerprint released
    warmd:v1:kjob:{<fp>}:<entry>      how an entry is built: a discovery's job record (signed)
    warmd:v1:ktask:{<fp>}:<digest>    the entries one task needs (a task digest; signed)
    warmd:v1:klist:{<fp>}:<digest>    a discovery of a set of tasks is published (its mark)

Every key is built, matched (SCAN patterns) and parsed here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from warmd import boundedjson
from warmd.store.signing import BAD_SIGNATURE
from warmd.store.signing import check as check_signature

PREFIX = "warmd:v1:"
CHUNK_SIZE = 1 << 20
FPS_KEY = f"{PREFIX}fps"
NODES_KEY = f"{PREFIX}stats:nodes"
KEY_PROOF_KEY = f"{PREFIX}keyproof"
STORE_ID_KEY = f"{PREFIX}store-id"
QUARANTINE_TTL_MS = 7 * 86400 * 1000
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254}$")
_BLOB_KEY = re.compile(rf"^{re.escape(PREFIX)}blob:\{{([0-9a-f]{{64}})\}}:\d+$")
_LEARNED_KEY = re.compile(rf"^{re.escape(PREFIX)}learned:\{{([^}}]*)\}}:(.*)$", re.DOTALL)
# Bounds of the one decoder every stored record goes through (checked before json.loads).
MAX_RECORD_BYTES = 1 << 20
MAX_DEPTH = boundedjson.MAX_DEPTH  # records nest 2 deep; fingerprint inputs a few more
MAX_TEXT = 4096  # characters of any one string field of a manifest or task record
MAX_TASK_ENTRIES = 10_000
WRONG_TYPE = b""  # how a key holding a list, hash... reads: undecodable, quarantinable
MAX_BLOB_BYTES = 1 << 40  # a size beyond any node's limit is corrupt, not "too large here"
# A plan's learned index (per fingerprint) is read before READY: its newest names only.
# Capture adds what an engine compiled after READY that no plan named: tens to hundreds.
MAX_LEARNED = 1000
LEARNED_CLOCK_SKEW = 3600.0  # seconds: names dated later than this are not "newest"


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


def learned_keys_pattern(plan: str | None = None) -> str:
    """SCAN pattern of the learned indexes of one plan (None: of every plan), under any
    fingerprint."""
    return f"{PREFIX}learned:*:{plan or '*'}"


def parse_learned_key(key: bytes | str) -> tuple[str, str] | None:
    """(fingerprint, plan) of a learned index key; None for any other key."""
    found = _LEARNED_KEY.match(_key_text(key))
    return (found.group(1), found.group(2)) if found else None


def claim_key(fp: str, name: str) -> str:
    """A pending claim: what a node captured, kept apart from every installable key."""
    return f"{PREFIX}claim:{{{fp}}}:{name}"


def claim_blob_key(fp: str, name: str, index: int) -> str:
    return f"{PREFIX}claimblob:{{{fp}}}:{name}:{index}"


def claims_key(fp: str) -> str:
    """The pending claims of one fingerprint, scored by when they were claimed."""
    return f"{PREFIX}claims:{{{fp}}}"


def arrivals_key(plan_digest: str) -> str:
    return f"{PREFIX}arrivals:{plan_digest}"


def renewed_key(fp: str, plan: str) -> str:
    """Set (NX, for the renew interval) by the node that renews the TTLs of what a plan of
    this fingerprint uses; the others find it and renew nothing."""
    return f"{PREFIX}renewed:{fp}:{plan}"


def kernel_lease_key(fp: str, name: str) -> str:
    return f"{PREFIX}klease:{{{fp}}}:{name}"


def kernel_channel(fp: str) -> str:
    return f"{PREFIX}kpub:{{{fp}}}"


def kernel_job_key(fp: str, entry: str) -> str:
    return f"{PREFIX}kjob:{{{fp}}}:{entry}"


def kernel_task_key(fp: str, digest: str) -> str:
    return f"{PREFIX}ktask:{{{fp}}}:{digest}"


def kernel_list_key(fp: str, digest: str) -> str:
    return f"{PREFIX}klist:{{{fp}}}:{digest}"


def blob_keys_pattern() -> str:
    """SCAN pattern of every blob chunk."""
    return f"{PREFIX}blob:*"


def parse_blob_key(key: bytes | str) -> str | None:
    """The blob digest of a chunk key; None for any other key."""
    found = _BLOB_KEY.match(_key_text(key))
    return found.group(1) if found else None


def manifest_keys_pattern() -> str:
    """SCAN pattern of every manifest, under any fingerprint."""
    return f"{PREFIX}man:*"


def task_keys_pattern(fp: str) -> str:
    """SCAN pattern of every task record of one fingerprint."""
    return task_key(fp, "*")


def _key_text(key: bytes | str) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key


def text(value) -> str:
    """A name or key as Redis returns it (bytes), as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def is_record_key(key: bytes | str) -> bool:
    """Whether a key is a manifest's or a task record's (what a signature covers)."""
    return _key_text(key).startswith((f"{PREFIX}man:", f"{PREFIX}task:"))


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

    @property
    def other_key(self) -> bool:
        """Whether the value carries a well-formed signature that this key did not make
        (another key's, or an altered record): evidence that this key may not be the
        cluster's (warmd.store.keyproof)."""
        return str(self) == BAD_SIGNATURE


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
        f = Fields(load_record(raw), "manifest")
        man = cls(f.text("library"), f.text("name"), f.text("fingerprint"), f.text("digest"),
                  f.integer("size", 0, MAX_BLOB_BYTES), f.text("producer", ""),
                  f.number("compile_seconds", 0.0, low=0.0), f.number("created", 0.0, low=0.0),
                  f.integer("chunk_size", 64 << 10, 64 << 20, CHUNK_SIZE),
                  f.integer("v", 0, 1 << 31, 1), f.signature())
        if man.v != 1:
            raise RefusedHere(f"unknown manifest version {man.v}")
        if not is_entry_name(man.name) or not _HEX64.match(man.digest):
            raise BadRecord("malformed manifest: name or digest")
        if man.size > max_size:
            raise RefusedHere(f"manifest size {man.size} is over this node's {max_size}-byte "
                              "limit")
        return man


@dataclass(frozen=True)
class StoredTaskRecord:
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

    def to_json(self) -> dict:
        data = asdict(self)
        data["entries"] = list(self.entries)
        if data["sig"] is None:
            del data["sig"]
        return data

    def encode(self) -> bytes:
        return json_bytes(self.to_json())

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


class Fields:
    """Strictly typed reads of a decoded record's fields: a field of the wrong type, out of
    range or not finite is a BadRecord naming it (never an OverflowError or TypeError)."""

    _MISSING = object()

    def __init__(self, data: dict, what: str) -> None:
        self.data, self.what = data, what

    def value(self, name: str, kind: type | tuple[type, ...], default=_MISSING):
        value = self.data.get(name, default)
        if value is self._MISSING:
            raise BadRecord(f"malformed {self.what}: no {name!r}")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BadRecord(f"malformed {self.what}: {name!r} is not {_kind_name(kind)}")
        return value

    def text(self, name: str, default=_MISSING) -> str:
        value = self.value(name, str, default)
        if len(value) > MAX_TEXT:
            raise BadRecord(f"malformed {self.what}: {name!r} is longer than {MAX_TEXT}")
        return value

    def integer(self, name: str, low: int, high: int, default=_MISSING) -> int:
        value = self.value(name, int, default)
        if not low <= value <= high:
            raise BadRecord(f"malformed {self.what}: {name!r} out of range [{low}, {high}]")
        return value

    def number(self, name: str, default=_MISSING, low: float = -math.inf) -> float:
        try:
            value = float(self.value(name, (int, float), default))
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise BadRecord(f"malformed {self.what}: {name!r} is not a finite number")
        if value < low:
            raise BadRecord(f"inconsistent {self.what}: {name!r} is below {low:g}")
        return value

    def signature(self) -> str | None:
        """The "sig" field: absent, or a string (its format is checked with the key)."""
        value = self.data.get("sig")
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > 128:
            raise BadRecord(f"malformed {self.what}: 'sig' is not a signature")
        return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"str": "a string", "int": "an integer", "float": "a number", "list": "a list"}
    return " or ".join(names.get(k.__name__, k.__name__) for k in kinds)


def load_record(raw: bytes | str | None, max_bytes: int = MAX_RECORD_BYTES) -> dict:
    """A JSON object from stored bytes, through the one bounded decoder (warmd.boundedjson:
    size and nesting depth checked before parsing; no NaN or Infinity). Raises BadRecord
    for anything else, never another error."""
    if not isinstance(raw, (bytes, str)):
        raise BadRecord("record is not a string value")
    try:
        data = boundedjson.loads(raw, max_bytes, MAX_DEPTH)
    except boundedjson.NotJson:
        raise BadRecord("record is not JSON") from None
    except boundedjson.JsonRefused as exc:
        raise BadRecord(f"record refused: {exc}") from None
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


def chunk_lengths(man: Manifest) -> list[int]:
    """The length every chunk of man's blob must have."""
    full, last = divmod(man.size, man.chunk_size)
    if not last and full:
        return [man.chunk_size] * full
    return [man.chunk_size] * full + [last]


def check_blob(man: Manifest, chunks: list[bytes | None]) -> bytes:
    """Join a blob's chunks and verify them against the manifest; raises BadRecord. Each
    chunk's length is checked before anything is joined."""
    lengths = chunk_lengths(man)
    if len(chunks) != len(lengths):
        raise BadRecord(f"{len(chunks)} chunks where the manifest has {len(lengths)}")
    for i, (chunk, length) in enumerate(zip(chunks, lengths, strict=True)):
        if not chunk and length:
            raise BadRecord(f"missing chunk {i} of {len(chunks)}")
        if len(chunk) < length:
            raise BadRecord(f"truncated blob: chunk {i} is {len(chunk)} of {length} bytes")
        if len(chunk) > length:
            raise BadRecord(f"oversized chunk {i}: over the manifest's {length} bytes")
    return verify_blob(man, b"".join(chunks))  # type: ignore[arg-type]


def verify_blob(man: Manifest, blob: bytes) -> bytes:
    """blob if it is the one man describes (length, SHA-256); raises BadRecord."""
    if len(blob) != man.size:
        raise BadRecord(f"truncated or oversized blob: {len(blob)} of {man.size} bytes")
    if sha256(blob) != man.digest:
        raise BadRecord("blob digest mismatch")
    return blob


MAX_CLAIM_PLANS = 64  # plans one claim names (a node warms a handful of models)


@dataclass(frozen=True)
class PendingClaim:
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

    @property
    def chunks(self) -> int:
        return chunk_count(self.size, self.chunk_size)

    def encode(self) -> bytes:
        data = asdict(self)
        data["plans"] = list(self.plans)
        return json_bytes(data)

    @classmethod
    def decode(cls, raw: bytes | str, max_size: int) -> PendingClaim:
        """Parse and check a stored claim; raises BadRecord (RefusedHere when over this
        node's size limit)."""
        f = Fields(load_record(raw), "claim")
        plans = f.value("plans", list)
        if not plans or len(plans) > MAX_CLAIM_PLANS or not all(
                isinstance(p, str) and 0 < len(p) <= MAX_TEXT for p in plans):
            raise BadRecord(f"malformed claim: plans must be 1 to {MAX_CLAIM_PLANS} strings")
        claim = cls(f.text("library"), f.text("name"), f.text("fingerprint"), f.text("digest"),
                    f.integer("size", 0, MAX_BLOB_BYTES), f.text("node", ""), tuple(plans),
                    f.number("compile_seconds", 0.0), f.number("created", 0.0),
                    f.integer("chunk_size", 64 << 10, 64 << 20, CHUNK_SIZE),
                    f.integer("v", 0, 1 << 31, 1))
        if claim.v != 1:
            raise RefusedHere(f"unknown claim version {claim.v}")
        if not is_entry_name(claim.name) or not _HEX64.match(claim.digest):
            raise BadRecord("malformed claim: name or digest")
        if claim.size > max_size:
            raise RefusedHere(f"claim size {claim.size} is over this node's {max_size}-byte "
                              "limit")
        return claim
