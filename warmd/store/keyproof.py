"""Whether this node holds the cluster's key, read from the store's key proof
(warmd:v1:keyproof, an HMAC only the cluster's key produces) each time it matters.

Quarantining, replacing and publishing are the actions a misconfigured node must never take
on a signed cluster's entries. A node takes them only while the stored proof is its own
(or, without a key, while the store holds no proof: an unsigned cluster). A missing proof
(a keyless writer deleted it, allkeys-LRU evicted it) is not an invitation: a keyed node
writes it again only when nothing it has seen or samples from the store is signed with
another key, so a node with the wrong key, which refuses every signature it samples, never
claims it, and a node with the right key, which verifies them, does. A well-formed proof of
another key is never overwritten: that is an operator's call (docs/redis.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import classify
from warmd.store.signing import SIG_FIELD, KeyProof, check, is_proof, key_proof, proof_state
from warmd.store.transport import RedisTransport
from warmd.store.validation import WRONG_TYPE, BadRecord, load_record

log = logging.getLogger("warmd.store")

RECHECK_SECONDS = 2.0  # how long a read of the proof stands before the next action reads it
SAMPLE_FINGERPRINTS = 8  # the most recently used fingerprints sampled before a claim...
SAMPLE_PER_FINGERPRINT = 2  # ...their most recently used manifests...
SAMPLE_RANDOM_KEYS = 16  # ...and records among random keys (not on Redis Cluster)

# Write the proof only over what was read (absent, a value that is not a proof, another
# Redis type); never with a TTL.
_CLAIM = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  if ARGV[3] ~= '1' then return 0 end
elseif kind == 'string' then
  if ARGV[3] == '1' or redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
elseif ARGV[2] ~= '' or ARGV[3] == '1' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Evidence:
    """Signed values sampled from the store: how many verify under this node's key and how
    many carry a well-formed signature of another key (unsigned or garbage values are
    anyone's and count for neither)."""

    verified: int = 0
    other_key: int = 0


class ClusterKey:
    def __init__(self, transport: RedisTransport, key: bytes | None,
                 warn_once: Callable[..., None]) -> None:
        self.transport = transport
        self.key = key
        self.warn_once = warn_once
        self.other_key_seen = False  # this process refused a signature of another key
        self._state: KeyProof | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def note_other_key(self) -> None:
        """A value refused here carries a well-formed signature of another key: this node
        never claims a missing proof from now on."""
        self.other_key_seen = True

    def state(self) -> KeyProof:
        """The store's proof as it stands for this node (read again after RECHECK_SECONDS),
        claimed first when it is missing and nothing says another key is the cluster's."""
        with self._lock:
            if self._state is not None and time.monotonic() - self._read_at < RECHECK_SECONDS:
                return self._state
        try:
            stored = self._read()
            state = proof_state(stored, self.key)
            if state is KeyProof.MISSING:
                state = self._claim(stored)
        except StoreFailed:
            return KeyProof.UNKNOWN
        if state.alarm:
            self.warn_once(f"keyproof:{state}", "shared cache %s: key proof %s",
                           self.transport.display_url, state.describe())
        with self._lock:
            self._state, self._read_at = state, time.monotonic()
        return state

    def _read(self) -> bytes | None:
        """The stored proof: None when absent, WRONG_TYPE for another Redis type."""
        (found,) = self.transport.op(lambda c: c.pipeline(transaction=False).get(
            layout.KEY_PROOF_KEY).execute(raise_on_error=False), "key proof")
        if isinstance(found, Exception):
            if classify(found) != "error":
                raise self.transport.failure(found, "key proof")
            return WRONG_TYPE
        return found

    def _claim(self, stored: bytes | None) -> KeyProof:
        """Write this node's proof over a missing one when no signed value this process
        refused or the store holds is another key's; the state that results."""
        if self.other_key_seen:
            return KeyProof.MISSING
        evidence = self.sample()
        if evidence.other_key:
            self.warn_once("keyproof:refrain", "shared cache %s: not writing the missing key "
                           "proof: %d of %d signed records sampled were signed with another "
                           "key", self.transport.display_url, evidence.other_key,
                           evidence.other_key + evidence.verified)
            return KeyProof.MISSING
        mine = key_proof(self.key)
        absent = stored is None

        def run(client):
            return client.register_script(_CLAIM)(
                keys=[layout.KEY_PROOF_KEY],
                args=[mine, b"" if absent else stored, "1" if absent else "0"], client=client)

        self.transport.op(run, "key proof")
        claimed = proof_state(self._read(), self.key)
        if claimed is KeyProof.OK and not absent:
            log.warning("shared cache %s: replaced a value at %s that was not a key proof",
                        self.transport.display_url, layout.KEY_PROOF_KEY)
        return claimed

    def sample(self) -> Evidence:
        """Check the signatures of a few records in the store: the latest manifests of the
        most recently used fingerprints, and records among random keys."""
        values = self.transport.op(self._sampled_values, "key proof")
        verified = other = 0
        for raw in values:
            try:
                record = load_record(raw)
            except BadRecord:
                continue
            sig = record.get(SIG_FIELD)
            if not isinstance(sig, str) or not is_proof(sig.encode()):
                continue  # unsigned or malformed: anyone's garbage, nobody's evidence
            if check(record, self.key) is None:
                verified += 1
            else:
                other += 1
        return Evidence(verified, other)

    def _sampled_values(self, client) -> list:
        pipe = client.pipeline(transaction=False)
        pipe.zrevrange(layout.FPS_KEY, 0, SAMPLE_FINGERPRINTS - 1)
        if not self.transport.store_url.cluster:
            for _ in range(SAMPLE_RANDOM_KEYS):
                pipe.randomkey()
        first = pipe.execute(raise_on_error=False)
        fps = [layout.text(fp) for fp in first[0]] if isinstance(first[0], list) else []
        keys = [k for k in first[1:] if isinstance(k, bytes) and layout.is_record_key(k)]
        pipe = client.pipeline(transaction=False)
        for fp in fps:
            pipe.zrevrange(layout.index_key(fp), 0, SAMPLE_PER_FINGERPRINT - 1)
        for fp, names in zip(fps, pipe.execute(raise_on_error=False) if fps else [],
                             strict=True):
            if isinstance(names, list):
                keys += [layout.manifest_key(fp, layout.text(n)) for n in names]
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for key in dict.fromkeys(keys):
            pipe.get(key)
        return [v for v in pipe.execute(raise_on_error=False) if isinstance(v, bytes)]
