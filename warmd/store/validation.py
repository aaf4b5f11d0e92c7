"""Validating what the store returns: the one bounded decoder every stored record goes
through (``load_record``), strictly typed reads of its fields (``Fields``), safe entry
names, and the errors that say why a record is refused (``BadRecord``: corrupt or
mismatched; ``RefusedHere``: not usable by this reader; ``SignatureRefused``)."""

from __future__ import annotations

import math
import re

from warmd import boundedjson
from warmd.store.signing import BAD_SIGNATURE

HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254}$")
# Bounds of the one decoder every stored record goes through (checked before json.loads).
MAX_RECORD_BYTES = 1 << 20
MAX_DEPTH = boundedjson.MAX_DEPTH  # records nest 2 deep; fingerprint inputs a few more
MAX_TEXT = 4096  # characters of any one string field of a manifest or task record
MAX_TASK_ENTRIES = 10_000
WRONG_TYPE = b""  # how a key holding a list, hash... reads: undecodable, quarantinable
MAX_BLOB_BYTES = 1 << 40  # a size beyond any node's limit is corrupt, not "too large here"


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
