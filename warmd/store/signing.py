"""HMAC-SHA256 signatures over canonical JSON: manifests and task records carry a "sig" field.

With a cluster key configured, every record must carry a valid signature; without one,
signatures are neither produced nor checked (a record's "sig" is ignored).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re

SIG_FIELD = "sig"
_SIG_FORMAT = re.compile(r"[0-9a-f]{64}")  # what sign() writes: lowercase hex SHA-256
BAD_SIGNATURE = "bad signature (signed with another key, or altered)"


def canonical(record: dict) -> bytes:
    """The bytes a signature covers: the record without its signature, keys sorted."""
    body = {k: v for k, v in record.items() if k != SIG_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(record: dict, key: bytes | None) -> dict:
    """A copy of record carrying the signature for key (unchanged without a key)."""
    body = {k: v for k, v in record.items() if k != SIG_FIELD}
    if key:
        body[SIG_FIELD] = hmac.new(key, canonical(body), hashlib.sha256).hexdigest()
    return body


def check(record: dict, key: bytes | None) -> str | None:
    """None when record is acceptable under key, else why it is refused."""
    if not key:
        return None
    sig = record.get(SIG_FIELD)
    if not isinstance(sig, str) or not sig:
        return "unsigned record while a signing key is configured"
    if not _SIG_FORMAT.fullmatch(sig):
        return "malformed signature (not 64 lowercase hex digits)"
    expected = hmac.new(key, canonical(record), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(sig, expected):
        return BAD_SIGNATURE
    return None


def key_proof(key: bytes) -> bytes:
    """What the store's key-proof record holds for key: an HMAC only that key produces, so a
    node checks a stored proof against its own key and nobody without the key can forge one
    (the proof reveals nothing of the key)."""
    return hmac.new(key, b"warmd:v1:keyproof", hashlib.sha256).hexdigest().encode()


class KeyProof(enum.StrEnum):
    """The store's key proof as a node with (or without) a signing key finds it."""

    OK = "ok"  # written with this node's key: the node may heal what it refuses
    UNSIGNED = "unsigned"  # no key here and no proof: an unsigned cluster
    MISSING = "missing"  # a key here, no proof (deleted, evicted, or nothing signed yet)
    FOREIGN = "foreign"  # written with another key, or planted
    KEYLESS = "keyless"  # a signed cluster (a proof) and no key here
    UNKNOWN = "unknown"  # the store could not be read


    @property
    def alarm(self) -> bool:
        """Whether an operator should act: no node (or not this one) may heal the store."""
        return self in (KeyProof.MISSING, KeyProof.FOREIGN, KeyProof.KEYLESS)

    @property
    def authority(self) -> bool:
        """Whether a node in this state may quarantine, replace and publish."""
        return self in (KeyProof.OK, KeyProof.UNSIGNED)

    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    KeyProof.OK: "written with this key",
    KeyProof.UNSIGNED: "none (an unsigned cluster)",
    KeyProof.MISSING: "MISSING: deleted or evicted (or nothing signed published yet); no "
                      "node heals or replaces refused entries until a node with the "
                      "cluster's key writes it again",
    KeyProof.FOREIGN: "FOREIGN: written with another key than this one (a misconfigured "
                      "node, or planted); this node quarantines, replaces and publishes "
                      "nothing",
    KeyProof.KEYLESS: "present, but no signing key is configured here: this node "
                      "quarantines, replaces and publishes nothing",
    KeyProof.UNKNOWN: "unknown (the store could not be read)",
}


def proof_json(state: KeyProof, key: bytes | None) -> dict:
    """A state as reports give it: "state", "alarm", what it means ("describe"), and the
    proof this node's key makes ("this_node": what an operator sets at warmd:v1:keyproof to
    name that key the cluster's; it reveals nothing of the key)."""
    return {"state": state.value, "alarm": state.alarm, "describe": state.describe(),
            "this_node": key_proof(key).decode() if key else None}


def is_proof(value: bytes | None) -> bool:
    """Whether a stored value has the form of a key proof (64 lowercase hex digits); a
    value that does not is nobody's proof."""
    return isinstance(value, bytes) and bool(_SIG_FORMAT.fullmatch(value.decode("latin-1")))


def proof_state(stored: bytes | None, key: bytes | None) -> KeyProof:
    """What the stored proof (None: absent) means for a node holding key (None: none). A
    value that is not a proof at all (another Redis type, garbage) reads as missing for a
    keyed node: only a well-formed proof of another key is foreign."""
    if stored is None or (key and not is_proof(stored)):
        return KeyProof.MISSING if key else KeyProof.UNSIGNED
    if not key:
        return KeyProof.KEYLESS
    return KeyProof.OK if hmac.compare_digest(stored, key_proof(key)) else KeyProof.FOREIGN
