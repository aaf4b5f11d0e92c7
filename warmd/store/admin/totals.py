"""`warmd cache stats`: the cluster-wide counters, per node and per fingerprint."""

from __future__ import annotations

from warmd.stats import hit_rate
from warmd.store import layout
from warmd.store.admin.reads import fingerprint_meta, fingerprints
from warmd.store.counters import read_counts, read_fp_counts, read_nodes
from warmd.store.shared import StoreSharedCache
from warmd.store.signing import proof_json


def read_stats(cache: StoreSharedCache) -> dict:
    """{"store", "nodes": node -> counters, "fingerprints": fp -> {"library", "entries",
    "namespace", "counters"}, "totals" (over nodes), "hit_rate"}."""
    cache.stats.flush()  # counters spooled while the store was away count now
    nodes = sorted(set(read_nodes(cache.backend.get(layout.NODES_KEY))))
    fps = fingerprints(cache)
    replies = cache.backend.get_many([layout.node_stats_key(n) for n in nodes])
    per_fp = read_fp_counts(cache.backend, fps, nodes)
    meta = fingerprint_meta(cache, fps)
    node_stats = {n: _counters(read_counts(r)) for n, r in zip(nodes, replies, strict=True)}
    fp_stats = {}
    for fp in fps:
        fp_stats[fp] = {"library": meta[fp]["library"], "entries": meta[fp]["entries"],
                        "namespace": meta[fp]["inputs"].get("namespace"),
                        "counters": _counters(per_fp[fp])}
    totals: dict[str, float] = {}
    for counters in node_stats.values():
        for name, value in counters.items():
            if name != "last_seen":
                totals[name] = totals.get(name, 0) + value
    return {"store": cache.display_url, "nodes": node_stats, "fingerprints": fp_stats,
            "totals": totals, "hit_rate": hit_rate(totals),
            "key_proof": proof_json(cache.key_proof, cache.session.signing_key)}


def _counters(counts: dict[str, float]) -> dict[str, float]:
    return {name: int(number) if number.is_integer() and name != "last_seen" else number
            for name, number in counts.items()}
