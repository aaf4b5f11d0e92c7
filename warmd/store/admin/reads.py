"""What every operator command reads: the fingerprints, their stored inputs, the entries
indexed under one (their used keys, layout.used_key), and raw replies turned into values (a
key of another Redis type reads as WRONG_TYPE, a store that went away raises StoreFailed)."""

from __future__ import annotations

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import classify
from warmd.store.formats import Manifest
from warmd.store.layout import text
from warmd.store.shared import StoreSharedCache
from warmd.store.validation import WRONG_TYPE, BadRecord, load_record

# Listing and pruning read every manifest whatever this node's own size limit: an entry too
# large to install here is still an entry (and its chunks are still referenced).
ANY_SIZE = 1 << 62


def string_reply(reply):
    """A GET reply as bytes (None: no key); a key of another type (WRONGTYPE) as b"".
    Other errors (the store went away) raise as StoreFailed."""
    if isinstance(reply, Exception):
        if classify(reply) != "error":
            raise StoreFailed(classify(reply), str(reply))
        return WRONG_TYPE
    return reply


def list_reply(reply):
    """A reply of a zset, set or hash command; None for a key of another Redis type
    (WRONGTYPE). Other errors (the store went away) raise as StoreFailed."""
    if isinstance(reply, Exception):
        if classify(reply) != "error":
            raise StoreFailed(classify(reply), str(reply))
        return None
    return reply


def wrong_types(cache: StoreSharedCache, expected: dict[str, str], what: str) -> list[str]:
    """The keys of `expected` (key -> the Redis type warmd writes there) that hold another
    type: written by something else, never readable as warmd's."""
    keys = list(expected)

    def run(client):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        return pipe.execute()

    found = cache.op(run, what) if keys else []
    return [key for key, kind in zip(keys, found, strict=True)
            if text(kind) not in ("none", expected[key])]


def get_many(client, keys: list, strict: bool = True) -> list:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    return pipe.execute(raise_on_error=strict)


def delete_many(client, keys: list) -> list:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.delete(key)
    return pipe.execute()


def scan(cache: StoreSharedCache, pattern: str, what: str) -> list:
    """Every key matching a layout pattern."""
    return cache.op(lambda c: list(c.scan_iter(match=pattern, count=500)), what)


def indexed(cache: StoreSharedCache, fp: str | None = None) -> dict[str, list[str]]:
    """fp -> the names of its entries with a used key (of fp, or of every fingerprint),
    sorted: one scan."""
    found: dict[str, list[str]] = {}
    for key in cache.backend.scan(layout.used_prefix(fp)):
        parsed = layout.parse_used_key(key)
        if parsed is not None:
            found.setdefault(parsed[0], []).append(parsed[1])
    return {f: sorted(names) for f, names in found.items()}


def fingerprints(cache: StoreSharedCache) -> list[str]:
    """Every fingerprint whose inputs are stored or that has indexed entries, sorted."""
    fps = {layout.parse_fp_meta_key(key) for key in cache.backend.scan(layout.FP_META_PREFIX)}
    return sorted({fp for fp in fps if fp} | set(indexed(cache)))


def fingerprint_meta(cache: StoreSharedCache, fps: list[str]) -> dict[str, dict]:
    """fp -> {"fingerprint", "library", "inputs", "entries"} ("malformed": True when its
    stored inputs are not a JSON object with a dict of inputs)."""
    counts = {fp: len(names) for fp, names in indexed(cache).items()} if fps else {}
    raws = cache.backend.get_many([layout.fp_meta_key(fp) for fp in fps])
    return {fp: {"fingerprint": fp, **_meta_fields(raw), "entries": counts.get(fp, 0)}
            for fp, raw in zip(fps, raws, strict=True)}


def _meta_fields(raw: bytes | Exception | None) -> dict:
    """library and inputs from a stored fingerprint record; one that is not a JSON object
    with a dict of inputs (written by something else, or damaged) is marked malformed."""
    if raw is None:
        return {"library": "?", "inputs": {}}
    try:
        meta = load_record(string_reply(raw))
    except BadRecord:
        meta = None
    if meta is None or not isinstance(meta.get("inputs", {}), dict):
        return {"library": "?", "inputs": {}, "malformed": True}
    return {"library": str(meta.get("library", "?")), "inputs": meta.get("inputs", {})}


def entries(cache: StoreSharedCache, fp: str) -> list[dict]:
    """Every entry indexed under fp: {"name", "last_used", "raw", "manifest", "problem",
    "index_ok"}, the manifest None when it expired or was evicted (raw None), or cannot be
    decoded (problem says why). A manifest key holding another Redis type reads as b""
    (what quarantine expects for it): malformed, like any undecodable value. A used key
    that holds no time (another type, or garbage) has last_used None and index_ok False.
    The used keys and manifests are read in one round trip."""
    names = indexed(cache, fp).get(fp, [])
    values = cache.backend.get_many([*(layout.used_key(fp, n) for n in names),
                                     *(layout.manifest_key(fp, n) for n in names)])
    out = []
    for name, used, raw in zip(names, values[:len(names)], values[len(names):],
                               strict=True):
        if raw is None and cache.backend.ttl_ms(layout.manifest_key(fp, name)) is not None:
            raw = WRONG_TYPE  # there, yet no value: a key of another type
        last_used = _time(used)
        item = {"name": name, "last_used": last_used, "raw": raw, "manifest": None,
                "problem": None, "index_ok": last_used is not None}
        if raw is not None:
            try:
                item["manifest"] = Manifest.decode(raw, ANY_SIZE)
            except BadRecord as exc:
                item["problem"] = exc
        out.append(item)
    return out


def _time(raw: bytes | None) -> float | None:
    """A used key's time; None when it holds none (another type, or garbage)."""
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def accepted(cache: StoreSharedCache, fp: str, item: dict) -> Manifest | None:
    """An indexed entry's manifest if a fetch here would accept it (None: absent)."""
    return cache.accept_manifest(item["raw"], fp, item["name"]) if item["raw"] else None
