"""Values the narrow store interface (warmd.store.backend) keeps as JSON (or decimal text)
and changes by compare-and-set, where Redis had a type of its own: `update` (read, change,
write only if unchanged, a bounded number of rounds), and
name indexes, {name: unix time added}, for sorted sets of names scored by time (the pending
captures, the learned entries of a plan, the daemon's node list).

A value that is not what its reader expects (not JSON, over its byte bound, another shape)
reads as empty and is replaced by the next writer; a key this interface cannot read (on
Redis, a key of another type) is never replaced: the update answers False.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterable

from warmd import boundedjson
from warmd.store.backend import KeyValueBackend

MAX_TRIES = 16  # compare-and-set rounds lost to other writers before an update gives up
# After a lost round, a writer waits a random time up to this, doubled each round (capped):
# writers racing on one value then spread out instead of losing to each other in lock step.
BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 0.002, 0.05
UNREAD = object()  # update's `raw` when the caller has not read the key
MAX_INDEX_BYTES = 4 << 20  # a name index read: beyond this it reads as empty
Change = Callable[[bytes | None], bytes | None]


def update(backend: KeyValueBackend, key: str, change: Change, ttl_ms: int | None = None,
           tries: int = MAX_TRIES, raw: bytes | None | object = UNREAD) -> bool:
    """Write change(what the key holds) there (None: delete it) if nobody wrote in between,
    trying again with the fresh value up to `tries` times (after a random wait that grows
    with each round lost); True once written (or when the change changes nothing), False
    when other writers kept winning or the key cannot be read. ``raw``: what the caller
    read at key (saves the first read). Raises StoreFailed."""
    if raw is UNREAD:
        raw = backend.get(key)
    for attempt in range(tries):
        value = change(raw)  # type: ignore[arg-type]
        if value == raw:
            return True
        if backend.compare_and_set(key, raw, value, ttl_ms):  # type: ignore[arg-type]
            return True
        time.sleep(random.uniform(0, min(MAX_BACKOFF_SECONDS, BACKOFF_SECONDS * 2 ** attempt)))
        fresh = backend.get(key)
        if raw is None and fresh is None:
            return False  # present (the write saw it) yet unreadable: not warmd's to replace
        raw = fresh
    return False


def read_index(raw: bytes | None, max_bytes: int = MAX_INDEX_BYTES) -> dict[str, float]:
    """The names of a name index with their times; {} for none, or for a value that is
    not an index (entries that are not a string with a finite time are left out)."""
    data = boundedjson.loads_as(raw, dict, max_bytes)
    return {name: float(at) for name, at in data.items()
            if isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at)}


def oldest_first(index: dict[str, float]) -> list[str]:
    """The names by the time they were added, ties by name (a sorted set's order)."""
    return [name for name, _at in sorted(index.items(), key=lambda item: (item[1], item[0]))]


def newest(index: dict[str, float], before: float, count: int) -> tuple[list[str], int]:
    """The newest `count` names of an index dated before `before` (a name dated later is
    not newest: left out), newest first; and how many names the index holds."""
    dated = [(at, name) for name, at in index.items() if at <= before]
    return [name for _at, name in sorted(dated, reverse=True)[:count]], len(index)


def add_names(backend: KeyValueBackend, key: str, names: dict[str, float], keep: int,
              ttl_ms: int | None = None, *, refresh: bool = True) -> bool:
    """Add names (name -> time; with refresh a name there gets the new time, else an index
    that lists every name is left as it is) to the index at key, keeping its newest `keep`;
    the index lives ttl_ms from now. Raises StoreFailed."""
    def change(raw: bytes | None) -> bytes | None:
        index = read_index(raw)
        if not refresh and raw is not None and set(names) <= set(index):
            return raw
        index.update(names)
        return _json({n: index[n] for n in oldest_first(index)[-keep:]})

    return update(backend, key, change, ttl_ms)


def remove_names(backend: KeyValueBackend, key: str, names: Iterable[str],
                 ttl_ms: int | None = None) -> bool:
    """Remove names from the index at key (an index left empty is deleted); ttl_ms as for
    add_names. Raises StoreFailed."""
    gone = set(names)

    def change(raw: bytes | None) -> bytes | None:
        index = read_index(raw)
        if raw is None or not gone & set(index):
            return raw  # nothing to remove: nothing written
        left = {n: at for n, at in index.items() if n not in gone}
        return _json(left) if left else None

    return update(backend, key, change, ttl_ms)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
