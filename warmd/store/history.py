"""Past compile times per kernel family (`<library>/<kernel>`, e.g. `flashinfer/act_and_mul`),
kept in one value of the store so that a plan can say, before any work, about how long its
cold tasks take to compile. The value is JSON, family -> [tasks compiled, seconds], and every
writer adds to it by compare-and-set (warmd.store.backend): writes are rare (one per warmup)
and a plan's estimate reads it in one get, where per-writer keys would need a scan of the
whole store. Bounded: at most MAX_FAMILIES families (a new family past that is not recorded),
MAX_BYTES in all; a value or a family's numbers that do not parse, or are out of range, are
ignored (the estimate is only shown, never acted on) and a writer replaces them."""

from __future__ import annotations

import json
import math

from warmd import boundedjson
from warmd.store import json_values, layout
from warmd.store.backend import KeyValueBackend

HISTORY_KEY = f"{layout.PREFIX}compile-times"  # (a Redis hash at warmd:v1:compile_times once)
MAX_FAMILIES = 1024
MAX_FAMILY_CHARS = 200
MAX_SECONDS = 24 * 3600.0  # per task: anything longer is not a compile time
MAX_BYTES = 1 << 20  # MAX_FAMILIES families of MAX_FAMILY_CHARS with their numbers fit


def write(backend: KeyValueBackend, times: dict[str, tuple[int, float]]) -> bool:
    """Add (tasks compiled, seconds) per family; False when other writers kept winning (or
    the key holds what this interface cannot read) and nothing was added."""
    wanted = {f: (int(n), float(s)) for f, (n, s) in times.items()
              if 0 < len(f) <= MAX_FAMILY_CHARS and n > 0 and math.isfinite(s) and s >= 0}
    if not wanted:
        return True
    def change(raw: bytes | None) -> bytes | None:
        history = _decode(raw)
        for family, (count, seconds) in wanted.items():
            if family not in history and len(history) >= MAX_FAMILIES:
                continue
            known = history.get(family, (0, 0.0))
            history[family] = (known[0] + count, known[1] + seconds)
        body = json.dumps({f: list(v) for f, v in history.items()},
                          separators=(",", ":")).encode()
        return body if len(body) <= MAX_BYTES else raw  # full: nothing added

    return json_values.update(backend, HISTORY_KEY, change)


def read(backend: KeyValueBackend, families: list[str]) -> dict[str, float]:
    """family -> mean seconds per compiled task, for the families with a sane history."""
    families = [f for f in dict.fromkeys(families) if 0 < len(f) <= MAX_FAMILY_CHARS]
    if not families:
        return {}
    history = _decode(backend.get(HISTORY_KEY))
    out = {}
    for family in families:
        if family in history:
            count, total = history[family]
            mean = total / count
            if 0 <= mean <= MAX_SECONDS:
                out[family] = mean
    return out


def _decode(raw: bytes | None) -> dict[str, tuple[int, float]]:
    """The families of a stored history with sane numbers (a count of at least one, a
    finite sum); {} for none or for a value that is not a history."""
    data = boundedjson.loads_as(raw, dict, MAX_BYTES)
    out = {}
    for family, value in list(data.items())[:MAX_FAMILIES]:
        if not (isinstance(value, list) and len(value) == 2
                and 0 < len(family) <= MAX_FAMILY_CHARS):
            continue
        count, total = _number(value[0]), _number(value[1])
        if count is not None and total is not None and count >= 1 and count == int(count):
            out[family] = (int(count), total)
    return out


def _number(raw: object) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = float(raw)
    return value if math.isfinite(value) else None
