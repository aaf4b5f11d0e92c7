"""The store's key layout (versioned prefix warmd:v1:). The records under those keys are
``formats.py`` (manifests, task records) and ``pending.py`` (pending captures), read through
``validation.py``; blobs are cut and checked by ``chunking.py``.

Keys that must live together in Redis Cluster share a hash tag: every chunk of one blob
({digest}), and everything of one fingerprint ({fp}: manifests, index, task records, leases).

    warmd:v1:blob:{<sha256>}:<i>      chunk i of a content-addressed blob (1 MiB chunks)
    warmd:v1:man:{<fp>}:<name>        manifest of one entry (JSON, optionally signed)
    warmd:v1:used:{<fp>}:<name>       when the entry was last published or used (unix time,
                                      text): the fingerprint's index, listed by scan
    warmd:v1:idx:{<fp>}               ZSET entry name -> last use: what older warmd wrote
                                      (prune removes it with its fingerprint)
    warmd:v1:task:{<fp>}:<task key>   task record: the entries one plan task produced
    warmd:v1:lease:{<fp>}:<task key>  single-flight lease (SET NX PX, renewed)
    warmd:v1:pub:{<fp>}:<task key>    pub/sub channel announcing a task's publication
    warmd:v1:quar:{<fp>}:<name>       a quarantined manifest with the reason
    warmd:v1:fp:{<fp>}                the fingerprint's inputs (JSON), for humans; the
                                      fingerprints are listed by scan of these
    warmd:v1:fps                      ZSET fingerprint -> last use: what older warmd wrote
    warmd:v1:keyproof                 HMAC of a constant under the cluster's signing key
    warmd:v1:store-id                 random id of this store (where unflushed stats spool)
    warmd:v1:counts:node:<node>       counters per node (JSON, compare-and-set)
    warmd:v1:counts:fp:{<fp>}:node:<node>  counters per fingerprint and node (JSON,
                                      compare-and-set by that node's processes only)
    warmd:v1:counts:fp:{<fp>}         counters per fingerprint, all nodes in one value: what
                                      older warmd wrote (read and added, never written)
    warmd:v1:counts:nodes             the node names with counters (JSON list)
    warmd:v1:compile-times            compile seconds per kernel family (JSON, history.py)
    warmd:v1:nodes:<ns>:<node id>     the daemon's JSON node record (expires unless rewritten)
    warmd:v1:nodelist:<ns>            JSON node id -> when first listed (ids with a record)
    warmd:v1:daemon:<ns>              JSON: the running controller's config summary
    warmd:v1:learnt:{<fp>}:<plan>     JSON name index of the entries nodes captured for a plan
                                      (warmd.capture; json_values; warmd:v1:learned:..., a
                                      ZSET, is what older warmd wrote)
    warmd:v1:arrivals:<plan digest>   counter of nodes that began a plan (shard order)
    (the pending captures' records and chunks keep their "claim" strings: stored captures
    stay readable)
    warmd:v1:claim:{<fp>}:<name>      a captured entry not re-derived yet (warmd.capture):
                                      JSON, never signed, never installed
    warmd:v1:claimblob:{<fp>}:<name>:<i>  chunk i of that capture's artifact
    warmd:v1:captures:{<fp>}          JSON capture name -> when it was (last) submitted
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
import re

PREFIX = "warmd:v1:"
FPS_KEY = f"{PREFIX}fps"
NODES_KEY = f"{PREFIX}counts:nodes"
KEY_PROOF_KEY = f"{PREFIX}keyproof"
STORE_ID_KEY = f"{PREFIX}store-id"
QUARANTINE_TTL_MS = 7 * 86400 * 1000
_FP_META_KEY = re.compile(rf"^{re.escape(PREFIX)}fp:\{{([^}}]*)\}}$")
_USED_KEY = re.compile(rf"^{re.escape(PREFIX)}used:\{{([^}}]*)\}}:(.*)$", re.DOTALL)
_BLOB_KEY = re.compile(rf"^{re.escape(PREFIX)}blob:\{{([0-9a-f]{{64}})\}}:\d+$")
_LEARNED_KEY = re.compile(rf"^{re.escape(PREFIX)}learnt:\{{([^}}]*)\}}:(.*)$", re.DOTALL)
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


def used_key(fp: str, name: str) -> str:
    """When entry `name` of fp was last published or used: one key per entry, so that the
    entries of a fingerprint are listed by a scan of used_prefix(fp)."""
    return f"{PREFIX}used:{{{fp}}}:{name}"


def used_prefix(fp: str | None = None) -> str:
    """The prefix of fp's used keys (None: of every fingerprint's)."""
    return f"{PREFIX}used:" if fp is None else used_key(fp, "")


def parse_used_key(key: str) -> tuple[str, str] | None:
    """(fingerprint, entry name) of a used key; None for any other key."""
    found = _USED_KEY.match(key)
    return (found.group(1), found.group(2)) if found else None


def task_key(fp: str, task: str) -> str:
    return f"{PREFIX}task:{{{fp}}}:{task}"


def learned_key(fp: str, plan: str) -> str:
    """The set of entries captured on nodes running a plan (names; each entry has its own
    signed task record, so this index only says what to fetch)."""
    return f"{PREFIX}learnt:{{{fp}}}:{plan}"


LEARNED_PREFIX = f"{PREFIX}learnt:"  # every learned index's key starts so


def parse_learned_key(key: bytes | str) -> tuple[str, str] | None:
    """(fingerprint, plan) of a learned index key; None for any other key."""
    found = _LEARNED_KEY.match(text(key))
    return (found.group(1), found.group(2)) if found else None


def capture_key(fp: str, name: str) -> str:
    """A pending capture: what a node captured, kept apart from every installable key."""
    return f"{PREFIX}claim:{{{fp}}}:{name}"


def capture_blob_key(fp: str, name: str, index: int) -> str:
    return f"{PREFIX}claimblob:{{{fp}}}:{name}:{index}"


def captures_key(fp: str) -> str:
    """The pending captures of one fingerprint, a name index (warmd.store.json_values) of
    when each was last submitted."""
    return f"{PREFIX}captures:{{{fp}}}"


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
    found = _BLOB_KEY.match(text(key))
    return found.group(1) if found else None


def manifest_keys_pattern() -> str:
    """SCAN pattern of every manifest, under any fingerprint."""
    return f"{PREFIX}man:*"


def task_keys_pattern(fp: str) -> str:
    """SCAN pattern of every task record of one fingerprint."""
    return task_key(fp, "*")


def text(value) -> str:
    """A name or key as Redis returns it (bytes), as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def is_record_key(key: bytes | str) -> bool:
    """Whether a key is a manifest's or a task record's (what a signature covers)."""
    return text(key).startswith((f"{PREFIX}man:", f"{PREFIX}task:"))


def lease_key(fp: str, task: str) -> str:
    return f"{PREFIX}lease:{{{fp}}}:{task}"


def channel(fp: str, task: str) -> str:
    return f"{PREFIX}pub:{{{fp}}}:{task}"


def quarantine_key(fp: str, name: str) -> str:
    return f"{PREFIX}quar:{{{fp}}}:{name}"


def fp_meta_key(fp: str) -> str:
    return f"{PREFIX}fp:{{{fp}}}"


FP_META_PREFIX = f"{PREFIX}fp:"  # every fingerprint's inputs (scanned: the fingerprints)


def parse_fp_meta_key(key: str) -> str | None:
    """The fingerprint of its inputs' key; None for any other key."""
    found = _FP_META_KEY.match(key)
    return found.group(1) if found else None


def node_stats_key(node: str) -> str:
    return f"{PREFIX}counts:node:{node}"


def fp_stats_key(fp: str) -> str:
    return f"{PREFIX}counts:fp:{{{fp}}}"


def fp_node_stats_key(fp: str, node: str) -> str:
    return f"{PREFIX}counts:fp:{{{fp}}}:node:{node}"


def nodes_key(namespace: str) -> str:
    """The namespace's node list (a name index, warmd.store.json_values)."""
    return f"{PREFIX}nodelist:{namespace}"


def node_key(namespace: str, node_id: str) -> str:
    return f"{PREFIX}nodes:{namespace}:{node_id}"


def daemon_key(namespace: str) -> str:
    return f"{PREFIX}daemon:{namespace}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
