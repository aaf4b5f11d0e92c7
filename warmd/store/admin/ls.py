"""`warmd cache ls`: fingerprints with their entry counts and bytes, the entries of one,
and the learned indexes (warmd.capture)."""

from __future__ import annotations

from collections.abc import Iterable

from warmd.store import json_values, layout
from warmd.store.admin.reads import (
    entries,
    fingerprint_meta,
    fingerprints,
)
from warmd.store.formats import Manifest
from warmd.store.shared import StoreSharedCache


def listing(cache: StoreSharedCache, selected: Iterable[str] = ()) -> list[dict]:
    """Fingerprints with entry counts and bytes (all, or the selected ones)."""
    fps = list(selected) or fingerprints(cache)
    meta = fingerprint_meta(cache, fps)
    for fp in fps:
        items = entries(cache, fp)
        meta[fp]["bytes"] = sum(i["manifest"].size for i in items if i["manifest"])
        meta[fp]["last_used"] = max((i["last_used"] for i in items), default=None)
    return [meta[fp] for fp in fps]


def entry_json(item: dict) -> dict:
    man: Manifest | None = item["manifest"]
    data = {"name": item["name"], "last_used": item["last_used"],
            "state": "ok" if man else ("missing" if item["raw"] is None else "malformed")}
    if man is not None:
        data.update({"library": man.library, "digest": man.digest, "size": man.size,
                     "producer": man.producer, "compile_seconds": man.compile_seconds,
                     "created": man.created, "signed": man.sig is not None})
    return data


def learned_indexes(cache: StoreSharedCache, plan_key: str | None = None) -> list[dict]:
    """Every learned index (warmd.capture), or those of one plan, under any fingerprint:
    {"fingerprint", "plan", "library", "entries": [the newest layout.MAX_LEARNED names],
    "total"}, by plan then library (a value that is no index: no names)."""
    keys = [(key, layout.parse_learned_key(key))
            for key in cache.backend.scan(layout.LEARNED_PREFIX)]
    found = [(key, *parsed) for key, parsed in keys
             if parsed and (plan_key is None or parsed[1] == plan_key)]
    raws = cache.backend.get_many([key for key, _fp, _plan in found]) if found else []
    meta = fingerprint_meta(cache, sorted({fp for _key, fp, _plan in found}))
    out = []
    for (_key, fp, plan), raw in zip(found, raws, strict=True):
        names, total = json_values.newest(json_values.read_index(raw), float("inf"),
                                          layout.MAX_LEARNED)
        out.append({"fingerprint": fp, "plan": plan, "library": meta[fp]["library"],
                    "entries": sorted(names), "total": total})
    return sorted(out, key=lambda i: (i["plan"], i["library"], i["fingerprint"]))
