"""JSON from bytes nobody vouches for (a stored record, a file a library's cache holds),
decoded within bounds checked before parsing: size, nesting depth; no NaN or Infinity.

``json.loads`` recurses once per nesting level: 100,000 opening brackets raise RecursionError
(not a ValueError) out of whatever called it. Here the depth is measured first, at C speed
(strings dropped, then innermost pairs peeled ``max_depth`` times), so every refusal is a
``JsonRefused`` and parsing never starts on what would exceed the bounds.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 32  # warmd's records nest 2 deep; library files (Triton groups, autotune) a few
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonRefused(ValueError):
    """Bytes that are not JSON within the bounds."""


class NotJson(JsonRefused):
    """Bytes that do not parse at all (cut short, not JSON): what a writer's partial file
    looks like, as opposed to well-formed JSON out of bounds."""


def nests_too_deep(raw: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests its arrays and objects deeper than max_depth, or leaves them
    unbalanced."""
    return bool(_unpeeled(raw, max_depth))


def _unpeeled(raw: bytes, max_depth: int) -> bytes:
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            break
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    return brackets


def loads(raw: bytes | str, max_bytes: int, max_depth: int = MAX_DEPTH) -> object:
    """The JSON value raw holds, if within max_bytes and max_depth and free of NaN and
    Infinity; raises JsonRefused (NotJson when raw does not parse), never another error."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, bytes):
        raise JsonRefused("not a string of bytes")
    if len(raw) > max_bytes:
        raise JsonRefused(f"{len(raw)} bytes, over the {max_bytes}-byte limit")
    left = _unpeeled(raw, max_depth)
    if left:
        if left.count(b"[") != left.count(b"]") or left.count(b"{") != left.count(b"}"):
            raise NotJson("not JSON (unbalanced brackets)")
        raise JsonRefused(f"nests deeper than {max_depth}")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except _Constant as exc:
        raise JsonRefused(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError, OverflowError):
        raise NotJson("not JSON") from None


def loads_as(raw: bytes | None, kind: type[dict] | type[list], max_bytes: int
             ) -> dict | list:
    """The JSON value raw holds when it is of kind (a dict or a list), else an empty one:
    for a stored value that may be absent (None), refused or of another shape."""
    try:
        data = loads(raw, max_bytes) if raw is not None else kind()
    except ValueError:
        return kind()
    return data if isinstance(data, kind) else kind()


class _Constant(ValueError):
    pass


def _no_constant(name: str):
    raise _Constant(f"{name} is not a number")
