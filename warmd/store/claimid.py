"""Who holds a claim (a single-flight lease, a claim on a unit of cluster work or on a
discovery), and whether a claim found held is one warmd honours.

A claim's value is its holder's record, ``c1|<node>|<pid>|<ms since the epoch>|<nonce>``,
and in a signed cluster ``|<mac>``: an HMAC under the claim key (derived from the signing
key) over the record and the claim's own store key, so that a writer without the key can
neither make one nor move one to another key. A claim is foreign, and taken over at once,
when its value is not such a record (or not a value the store interface can read: a key of
another Redis type), when it is dated in the future, when the cluster is signed and its MAC
is missing or wrong, or when its TTL is missing or longer than any warmd sets
(MAX_CLAIM_TTL_MS). One that looks right is waited on, at most for the single-flight timeout
(warmd.store.leases, warmd.warmup.claims).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
import uuid
from dataclasses import dataclass

from warmd.store.backend import NO_EXPIRY

VERSION = "c1"
# The longest TTL warmd sets on a claim (the default single-flight lease is 30 s, a kernel
# claim 3 s; a lease is refused above this): a longer one, or none, is planted.
MAX_CLAIM_TTL_MS = 120_000
CLOCK_SKEW_MS = 300_000  # a record dated further ahead than this is planted
MAX_RECORD = 400  # characters
_NODE = re.compile(r"[A-Za-z0-9._:@+-]{1,200}")
_NONCE = re.compile(r"[0-9a-f]{12}")
_MAC = re.compile(r"[0-9a-f]{32}")


def claim_key(signing_key: bytes | None) -> bytes | None:
    """The key claim records are signed with: derived from the signing key, so a process
    that holds only this one can sign claims but not manifests."""
    if not signing_key:
        return None
    return hmac.new(signing_key, b"warmd:v1:claim-key", hashlib.sha256).digest()


def _mac(key: bytes, body: str, store_key: str) -> str:
    return hmac.new(key, f"{body}\n{store_key}".encode(), hashlib.sha256).hexdigest()[:32]


def make_record(node: str, store_key: str, key: bytes | None) -> str:
    """A fresh record for this process holding the claim at store_key."""
    safe_node = re.sub(r"[^A-Za-z0-9._:@+-]", "_", node)[:200] or "_"
    body = (f"{VERSION}|{safe_node}|{os.getpid()}|{int(time.time() * 1000)}|"
            f"{uuid.uuid4().hex[:12]}")
    return f"{body}|{_mac(key, body, store_key)}" if key else body


@dataclass(frozen=True)
class Holder:
    """A claim found held: who (as read), and why it is foreign ("" when it is honoured)."""

    who: str
    foreign: str = ""


def judge(raw: bytes | None, ttl_ms: int, store_key: str, key: bytes | None,
          now: float | None = None) -> Holder:
    """Whether the claim holding store_key is honoured: its value raw (None: a value the
    store interface cannot read), its time to live ttl_ms (backend.NO_EXPIRY: none)."""
    if raw is None:
        return Holder("?", "a value this interface cannot read")
    text = raw.decode(errors="replace")
    parts = text[:MAX_RECORD + 1].split("|")
    if len(text) > MAX_RECORD or len(parts) not in (5, 6) or parts[0] != VERSION:
        return Holder("?", "not a claim record")
    _, node, pid, at, nonce, *mac = parts
    if not (_NODE.fullmatch(node) and pid.isdigit() and at.isdigit()
            and _NONCE.fullmatch(nonce)):
        return Holder("?", "not a claim record")
    who = f"{node}:{pid}"
    if ttl_ms == NO_EXPIRY:
        return Holder(who, "no TTL")
    if ttl_ms > MAX_CLAIM_TTL_MS:
        return Holder(who, f"TTL {ttl_ms / 1000:.0f} s, longer than warmd sets")
    if int(at) > (now if now is not None else time.time()) * 1000 + CLOCK_SKEW_MS:
        return Holder(who, "dated in the future")
    if key is not None:
        body = "|".join(parts[:5])
        if not mac or not _MAC.fullmatch(mac[0]):
            return Holder(who, "unsigned in a signed cluster")
        if not hmac.compare_digest(mac[0], _mac(key, body, store_key)):
            return Holder(who, "bad signature")
    return Holder(who)
