"""Past compile times per kernel family (`<library>/<kernel>`, e.g. `flashinfer/act_and_mul`),
kept in one Redis hash so that a plan can say, before any work, about how long its cold
tasks take to compile. Bounded: at most MAX_FAMILIES families (a new family past that is not
recorded), each a count and a sum; a value that does not parse, or is out of range, is
ignored (the estimate is only shown, never acted on)."""

from __future__ import annotations

import math

from warmd.store import layout

HISTORY_KEY = f"{layout.PREFIX}compile_times"
MAX_FAMILIES = 1024
MAX_FAMILY_CHARS = 200
MAX_SECONDS = 24 * 3600.0  # per task: anything longer is not a compile time


def write(client, times: dict[str, tuple[int, float]]) -> None:
    """Add (tasks compiled, seconds) per family."""
    wanted = {f: v for f, v in times.items() if 0 < len(f) <= MAX_FAMILY_CHARS and v[0] > 0}
    if not wanted:
        return
    pipe = client.pipeline(transaction=False)
    pipe.hlen(HISTORY_KEY)
    for family in wanted:
        pipe.hexists(HISTORY_KEY, f"{family}|n")
    size, *known = pipe.execute()
    room = max(0, 2 * MAX_FAMILIES - int(size)) // 2
    pipe = client.pipeline(transaction=False)
    for (family, (count, seconds)), exists in zip(wanted.items(), known, strict=True):
        if not exists:
            if room <= 0:
                continue
            room -= 1
        pipe.hincrby(HISTORY_KEY, f"{family}|n", int(count))
        pipe.hincrbyfloat(HISTORY_KEY, f"{family}|s", float(seconds))
    pipe.execute()


def read(client, families: list[str]) -> dict[str, float]:
    """family -> mean seconds per compiled task, for the families with a sane history."""
    families = [f for f in dict.fromkeys(families) if 0 < len(f) <= MAX_FAMILY_CHARS]
    if not families:
        return {}
    fields = [field for f in families for field in (f"{f}|n", f"{f}|s")]
    values = client.hmget(HISTORY_KEY, fields)
    out = {}
    for i, family in enumerate(families):
        count, total = _number(values[2 * i]), _number(values[2 * i + 1])
        if count is not None and total is not None and count >= 1:
            mean = total / count
            if 0 <= mean <= MAX_SECONDS:
                out[family] = mean
    return out


def _number(raw) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
