"""`warmd cache stats`: the cluster-wide counters, per node and per fingerprint."""

from __future__ import annotations

from warmd.stats import hit_rate
from warmd.store import layout
from warmd.store.admin.reads import fingerprint_meta, fingerprints, list_reply, read_one, text
from warmd.store.redis_store import RedisSharedCache
from warmd.store.signing import proof_json


def read_stats(cache: RedisSharedCache) -> dict:
    """{"store", "nodes": node -> counters, "fingerprints": fp -> {"library", "entries",
    "namespace", "counters"}, "totals" (over nodes), "hit_rate"}."""
    cache.stats.flush()  # counters spooled while the store was away count now
    nodes = sorted(text(n) for n in read_one(
        cache, "stats", lambda pipe: pipe.smembers(layout.NODES_KEY)) or ())
    fps = fingerprints(cache)

    def run(client):
        pipe = client.pipeline(transaction=False)
        for node in nodes:
            pipe.hgetall(layout.node_stats_key(node))
        for fp in fps:
            pipe.hgetall(layout.fp_stats_key(fp))
        return [list_reply(r) or {} for r in pipe.execute(raise_on_error=False)]

    replies = cache.op(run, "stats") if nodes or fps else []
    meta = fingerprint_meta(cache, fps)
    node_stats = {n: _counters(r) for n, r in zip(nodes, replies[:len(nodes)], strict=True)}
    fp_stats = {}
    for fp, raw in zip(fps, replies[len(nodes):], strict=True):
        fp_stats[fp] = {"library": meta[fp]["library"], "entries": meta[fp]["entries"],
                        "namespace": meta[fp]["inputs"].get("namespace"),
                        "counters": _counters(raw)}
    totals: dict[str, float] = {}
    for counters in node_stats.values():
        for name, value in counters.items():
            if name != "last_seen":
                totals[name] = totals.get(name, 0) + value
    return {"store": cache.display_url, "nodes": node_stats, "fingerprints": fp_stats,
            "totals": totals, "hit_rate": hit_rate(totals),
            "key_proof": proof_json(cache.key_proof, cache.session.signing_key)}


def _counters(raw: dict) -> dict[str, float]:
    out = {}
    for key, value in raw.items():
        name = text(key)
        try:
            number = float(value)
        except ValueError:
            continue
        out[name] = int(number) if number.is_integer() and name != "last_seen" else number
    return out
