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
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.signing import SIG_FIELD, KeyProof, check, is_proof, key_proof, proof_state
from warmd.store.validation import WRONG_TYPE, BadRecord, load_record

log = logging.getLogger("warmd.store")

RECHECK_SECONDS = 2.0  # how long a read of the proof stands before the next action reads it
SAMPLE_RECORDS = 32  # manifests and task records, drawn at random, checked before a claim
_RECORD_PREFIXES = (f"{layout.PREFIX}man:", f"{layout.PREFIX}task:")


@dataclass(frozen=True)
class Evidence:
    """Signed values sampled from the store: how many verify under this node's key and how
    many carry a well-formed signature of another key (unsigned or garbage values are
    anyone's and count for neither)."""

    verified: int = 0
    other_key: int = 0


class ClusterKey:
    def __init__(self, backend: KeyValueBackend, key: bytes | None,
                 warn_once: Callable[..., None], display_url: str) -> None:
        self.backend = backend
        self.key = key
        self.warn_once = warn_once
        self.display_url = display_url
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
                           self.display_url, state.describe())
        with self._lock:
            self._state, self._read_at = state, time.monotonic()
        return state

    def _read(self) -> bytes | None:
        return read_proof(self.backend)

    def _unreadable(self) -> bool:
        return (self.backend.get(layout.KEY_PROOF_KEY) is None
                and self.backend.ttl_ms(layout.KEY_PROOF_KEY) is not None)

    def _claim(self, stored: bytes | None) -> KeyProof:
        """Write this node's proof over a missing one when no signed value this process
        refused or the store holds is another key's; the state that results."""
        if self.other_key_seen:
            return KeyProof.MISSING
        evidence = self.sample()
        if evidence.other_key:
            self.other_key_seen = True  # (sampled again at every state() otherwise)
            self.warn_once("keyproof:refrain", "shared cache %s: not writing the missing key "
                           "proof: %d of %d signed records sampled were signed with another "
                           "key", self.display_url, evidence.other_key,
                           evidence.other_key + evidence.verified)
            return KeyProof.MISSING
        self._write_over(stored, key_proof(self.key))
        claimed = proof_state(self._read(), self.key)
        if claimed is KeyProof.OK and stored is not None:
            log.warning("shared cache %s: replaced a value at %s that was not a key proof",
                        self.display_url, layout.KEY_PROOF_KEY)
        return claimed

    def _write_over(self, stored: bytes | None, mine: bytes) -> None:
        """Write the proof only over what was read (absent, a value that is not a proof, a
        key of another type), never with a TTL. A key of another type cannot be replaced
        conditionally through the interface: it is deleted, if still unreadable, and the
        proof then written only where nothing was written meanwhile."""
        key = layout.KEY_PROOF_KEY
        if stored is None:
            self.backend.put(key, mine, if_absent=True)
        elif self.backend.compare_and_set(key, stored, mine):
            return
        elif stored == WRONG_TYPE and self._unreadable():
            self.backend.delete([key])
            self.backend.put(key, mine, if_absent=True)

    def sample(self) -> Evidence:
        """Check the signatures of a few manifests and task records drawn at random from
        the store."""
        keys = [k for prefix in _RECORD_PREFIXES for k in self.backend.scan(prefix)]
        values = self.backend.get_many(random.sample(keys, min(len(keys), SAMPLE_RECORDS)))
        verified = other = 0
        for raw in values:
            if raw is None:
                continue
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


def read_proof(backend: KeyValueBackend) -> bytes | None:
    """The stored proof: None when absent, WRONG_TYPE for a key the interface cannot read
    (on Redis, one of another type). Raises StoreFailed."""
    found = backend.get(layout.KEY_PROOF_KEY)
    if found is None and backend.ttl_ms(layout.KEY_PROOF_KEY) is not None:
        return WRONG_TYPE
    return found
