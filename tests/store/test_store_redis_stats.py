"""The shared cache's stats and compile-time history against a real redis-server: counters
per node and per fingerprint, racing writers that lose no count, planted values."""

from __future__ import annotations

import json
import threading

import pytest
from store_support import DirAdapter, fp_counts, module_server, task_entries, warm

from warmd.store import admin, layout

server = module_server("admin-pw")
# Caches made by the shared `caches` fixture (tests/conftest.py) poll quickly here.
CACHE_DEFAULTS = {"poll_interval": 0.1}


def test_stats_per_node_and_fingerprint(server, rclient, caches, tmp_path):
    one, two = caches(server.url, node="alpha"), caches(server.url, node="beta")
    plan = task_entries(3)
    warm(one, DirAdapter(tmp_path / "a"), plan)
    warm(two, DirAdapter(tmp_path / "b"), plan)
    one.stats.record_outcomes({"failed": 1, "testlib.failed": 1, "corrupt_rejected": 99})
    data = admin.read_stats(one)
    alpha, beta = data["nodes"]["alpha"], data["nodes"]["beta"]
    assert alpha["compiled"] == 6 and alpha["failed"] == 1 and alpha["published"] == 6
    assert beta["remote_hits"] == 6 and beta.get("compiled", 0) == 0
    assert beta["bytes_fetched"] == alpha["bytes_published"] > 0
    assert "corrupt_rejected" not in alpha  # only the store counts refusals
    (fp_stats,) = data["fingerprints"].values()
    assert fp_stats["counters"]["remote_hits"] == 6 and fp_stats["counters"]["published"] == 6
    assert fp_stats["counters"]["failed"] == 1 and fp_stats["entries"] == 6
    assert data["totals"]["remote_hits"] == 6 and data["hit_rate"] == pytest.approx(6 / 13)


def test_stats_flushed_by_racing_nodes_add_up(server, rclient, caches):
    """A node's counters, overall and per fingerprint, are values only its own processes
    add to (by compare-and-set): nodes flushing at once lose none of one another's counts,
    and the fingerprint's counters are their sum."""
    nodes = [caches(server.url, node=f"racer{i}") for i in range(4)]

    def flush(cache) -> None:
        for _ in range(10):
            cache.stats.count("corrupt_rejected", 1, fp="f" * 64)
            assert cache.stats.flush()

    threads = [threading.Thread(target=flush, args=(c,)) for c in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert fp_counts(nodes[0], "f" * 64)["corrupt_rejected"] == 40
    for i in range(4):  # each node writes its own value: none races another's
        own = json.loads(rclient.get(layout.fp_node_stats_key("f" * 64, f"racer{i}")))
        assert own["corrupt_rejected"] == 10
    data = admin.read_stats(nodes[0])
    assert {n: data["nodes"][n]["corrupt_rejected"] for n in data["nodes"]} == {
        f"racer{i}": 10 for i in range(4)}


def test_stats_values_that_are_not_counters_are_replaced_or_lose_only_their_own(
        server, rclient, caches):
    cache = caches(server.url, node="writer")
    rclient.set(layout.NODES_KEY, b"not a list")
    rclient.set(layout.node_stats_key("writer"), b'{"corrupt_rejected": "many"')
    rclient.hset(layout.fp_node_stats_key("a" * 64, "writer"), "planted", "1")
    cache.stats.count("corrupt_rejected", 2, fp="a" * 64)
    cache.stats.count("tasks_hit", 1, fp="b" * 64)
    assert cache.stats.flush()
    assert json.loads(rclient.get(layout.NODES_KEY)) == ["writer"]
    assert json.loads(rclient.get(layout.node_stats_key("writer")))["corrupt_rejected"] == 2
    assert rclient.hgetall(layout.fp_node_stats_key("a" * 64, "writer")) == {b"planted": b"1"}
    assert fp_counts(cache, "a" * 64) == {}  # the planted value is read as no counters
    assert json.loads(rclient.get(layout.fp_node_stats_key("b" * 64, "writer"))) == {
        "tasks_hit": 1}


def test_compile_time_history_is_kept_per_family_and_bounded(tmp_path):
    """The history a plan's estimate reads: mean seconds per task of each kernel family,
    summed over writers; at most MAX_FAMILIES families; a planted value is ignored and
    replaced by the next writer."""
    from store_support import start_test_server

    from warmd.store import history, open_shared_cache

    server = start_test_server(tmp_path)
    try:
        one, two = open_shared_cache(server.url), open_shared_cache(server.url)
        one.stats.record_compile_times({"flashinfer/act_and_mul": (1, 30.0)})
        two.stats.record_compile_times({"flashinfer/act_and_mul": (3, 90.0),
                                        "deep_gemm/x": (1, 5.0)})
        assert one.stats.compile_times(["flashinfer/act_and_mul", "deep_gemm/x", "nope/y"]) == {
            "flashinfer/act_and_mul": 30.0, "deep_gemm/x": 5.0}
        client = server.client()
        client.set(history.HISTORY_KEY, json.dumps({
            "planted/a": ["x", 1], "planted/b": [1, "inf"], "planted/c": [0, 5],
            "planted/d": [1, -1], "planted/e": [2.5, 1], "ok/f": [2, 10]}))
        assert one.stats.compile_times(["planted/a", "planted/b", "planted/c", "planted/d",
                                  "planted/e", "ok/f"]) == {"ok/f": 5.0}
        client.set(history.HISTORY_KEY, b"\xff not json")
        assert one.stats.compile_times(["ok/f"]) == {}
        two.stats.record_compile_times({"ok/f": (1, 1.0)})
        assert one.stats.compile_times(["ok/f"]) == {"ok/f": 1.0}
        many = {f"lib/k{i}": (1, 1.0) for i in range(history.MAX_FAMILIES + 50)}
        one.stats.record_compile_times(many)
        assert len(json.loads(client.get(history.HISTORY_KEY))) == history.MAX_FAMILIES
        one.close()
        two.close()
    finally:
        server.stop()


def test_compile_time_history_loses_no_writer_racing_another(tmp_path):
    """Writers on several nodes at once: compare-and-set, so every task counts."""
    from store_support import start_test_server

    from warmd.store import history, open_shared_cache

    server = start_test_server(tmp_path)
    caches = [open_shared_cache(server.url) for _ in range(4)]
    try:
        def record(cache) -> None:
            for _ in range(10):
                cache.stats.record_compile_times({"lib/k": (1, 2.0), "lib/other": (2, 2.0)})

        threads = [threading.Thread(target=record, args=(c,)) for c in caches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert history.read(caches[0].backend, ["lib/k", "lib/other"]) == {
            "lib/k": 2.0, "lib/other": 1.0}
        assert json_counts(server.client().get(history.HISTORY_KEY)) == {
            "lib/k": 40, "lib/other": 80}
    finally:
        for cache in caches:
            cache.close()
        server.stop()


def json_counts(raw: bytes) -> dict[str, int]:
    return {family: value[0] for family, value in json.loads(raw).items()}
