"""What every operator command reads: the fingerprints, their stored inputs, the entries
indexed under one, and raw replies turned into values (a key of another Redis type reads as
WRONG_TYPE, a store that went away raises StoreFailed)."""

from __future__ import annotations

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import classify
from warmd.store.formats import Manifest
from warmd.store.layout import text
from warmd.store.redis_store import RedisSharedCache
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


def read_one(cache: RedisSharedCache, what: str, command):
    """command(pipe)'s reply as list_reply gives it: a key of another type is None, not an
    aborted command."""
    def run(client):
        pipe = client.pipeline(transaction=False)
        command(pipe)
        return pipe.execute(raise_on_error=False)[0]

    return list_reply(cache.op(run, what))


def wrong_types(cache: RedisSharedCache, expected: dict[str, str], what: str) -> list[str]:
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


def scan(cache: RedisSharedCache, pattern: str, what: str) -> list:
    """Every key matching a layout pattern."""
    return cache.op(lambda c: list(c.scan_iter(match=pattern, count=500)), what)


def fingerprints(cache: RedisSharedCache) -> list[str]:
    """The fingerprints by last use (none when the list holds another Redis type)."""
    found = read_one(cache, "ls", lambda pipe: pipe.zrange(layout.FPS_KEY, 0, -1))
    return [text(fp) for fp in found or []]


def fingerprint_meta(cache: RedisSharedCache, fps: list[str]) -> dict[str, dict]:
    """fp -> {"fingerprint", "library", "inputs", "entries"} ("malformed": True when its
    stored inputs are not a JSON object with a dict of inputs)."""
    def run(client):
        pipe = client.pipeline(transaction=False)
        for fp in fps:
            pipe.get(layout.fp_meta_key(fp))
            pipe.zcard(layout.index_key(fp))
        return pipe.execute(raise_on_error=False)

    replies = cache.op(run, "ls") if fps else []
    out = {}
    for i, fp in enumerate(fps):
        raw, count = replies[2 * i], replies[2 * i + 1]
        out[fp] = {"fingerprint": fp, **_meta_fields(raw),
                   "entries": 0 if isinstance(count, Exception) else int(count)}
    return out


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


def entries(cache: RedisSharedCache, fp: str) -> list[dict]:
    """Every entry indexed under fp: {"name", "last_used", "raw", "manifest", "problem"},
    the manifest None when it expired or was evicted (raw None), or cannot be decoded
    (problem says why). A manifest key holding another Redis type reads as b"" (what
    quarantine expects for it): malformed, like any undecodable value."""
    members = read_one(cache, "ls", lambda pipe: pipe.zrange(layout.index_key(fp), 0, -1,
                                                            withscores=True)) or []

    def run(client):
        return get_many(client, [layout.manifest_key(fp, text(name)) for name, _ in members],
                        strict=False)

    raws = cache.op(run, "ls") if members else []
    out = []
    for (name, score), reply in zip(members, raws, strict=True):
        raw = string_reply(reply)
        item = {"name": text(name), "last_used": score, "raw": raw, "manifest": None,
                "problem": None}
        if raw is not None:
            try:
                item["manifest"] = Manifest.decode(raw, ANY_SIZE)
            except BadRecord as exc:
                item["problem"] = exc
        out.append(item)
    return out


def accepted(cache: RedisSharedCache, fp: str, item: dict) -> Manifest | None:
    """An indexed entry's manifest if a fetch here would accept it (None: absent)."""
    return cache.accept_manifest(item["raw"], fp, item["name"]) if item["raw"] else None
