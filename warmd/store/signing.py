"""HMAC-SHA256 signatures over canonical JSON: manifests and task records carry a "sig" field.

With a cluster key configured, every record must carry a valid signature; without one,
signatures are neither produced nor checked (a record's "sig" is ignored).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

SIG_FIELD = "sig"
_SIG_FORMAT = re.compile(r"[0-9a-f]{64}")  # what sign() writes: lowercase hex SHA-256


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
        return "bad signature (signed with another key, or altered)"
    return None


def key_proof(key: bytes) -> bytes:
    """What the store's key-proof record holds for key: who wrote it first set the cluster's
    key, and a node whose own proof differs knows its key is not the cluster's (the proof
    reveals nothing of the key)."""
    return hmac.new(key, b"warmd:v1:keyproof", hashlib.sha256).hexdigest().encode()
