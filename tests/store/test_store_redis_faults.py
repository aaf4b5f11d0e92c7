"""The shared cache against a real redis-server that fails: down before a warmup, lost and
back mid-run, paused past the join budget, out of memory or read-only."""

from __future__ import annotations

import os
import signal
import time

from store_support import DirAdapter, publish_entries, start_test_server, task_entries, warm

from warmd.store.breaker import CircuitBreaker

# Caches made by the shared `caches` fixture (tests/conftest.py) poll quickly here.
CACHE_DEFAULTS = {"poll_interval": 0.1}


def test_store_down_before_warmup(tmp_path, caches):
    from warmd.store import free_port

    cache = caches(f"redis://:secret-pw@127.0.0.1:{free_port()}/0")
    adapter = DirAdapter(tmp_path / "a")
    start = time.monotonic()
    counts = warm(cache, adapter, task_entries(5))
    assert time.monotonic() - start < 3
    assert counts["compiled"] == 10 and len(adapter.list_entries()) == 10
    assert cache.stats.counters["store_errors"] >= 1 and cache.stats.counters["store_skipped"] >= 5
    assert "published" not in cache.stats.counters


def test_store_lost_mid_run_then_back(tmp_path, caches):
    srv = start_test_server(tmp_path / "s1", password="pw")
    try:
        # a store lost after it answered is retried for the join budget: kept short here;
        # the breaker's cooldown is not doubled past 0.3 s by the failed probes of the run
        # without the store (a loaded machine's slower run makes more of them)
        cache = caches(srv.url, breaker=CircuitBreaker(cooldown=0.3, max_cooldown=0.3),
                       join_budget=1.0)
        adapter = DirAdapter(tmp_path / "a")
        plan = task_entries(6)
        first = dict(list(plan.items())[:3])
        assert warm(cache, adapter, first)["compiled"] == 6
        assert cache.stats.counters["published"] == 6
        srv.stop()
        rest = dict(list(plan.items())[3:])
        assert warm(cache, adapter, rest)["compiled"] == 6  # local compiles, no exception
        assert cache.stats.counters["store_errors"] >= 1
        assert cache.stats.counters["published"] == 6
        # Back (same data dir, same port): the breaker re-probes and sharing resumes.
        srv2 = start_test_server(tmp_path / "s1", password="pw", port=srv.port)
        try:
            time.sleep(0.4)
            fresh = DirAdapter(tmp_path / "b")
            extra = task_entries(2, prefix="later")
            warm(cache, fresh, extra)
            assert cache.stats.counters["published"] == 10
        finally:
            srv2.stop()
    finally:
        srv.stop()


def test_paused_server_is_retried_for_the_join_budget_then_degrades(tmp_path, caches):
    srv = start_test_server(tmp_path, password="pw")
    cache = caches(srv.url, socket_timeout=0.5, breaker=CircuitBreaker(cooldown=1.5),
                   join_budget=1.0)
    a = DirAdapter(tmp_path / "a")
    publish_entries(cache, a, "testlib/p", ["kernel.p.0001"])
    b = DirAdapter(tmp_path / "b")
    os.kill(srv.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert cache.entries.fetch_task(b, "testlib/p") is None
        for i in range(5):
            assert cache.entries.fetch_task(b, f"testlib/q{i}") is None
        with cache.claims.single_flight("testlib/p", 30) as mine:
            assert mine
        publish_entries(cache, b, "testlib/q", ["kernel.q.0001"])
        # timeouts retried (backoff, jitter) for the 1 s budget, then the breaker answers
        assert 1.0 <= time.monotonic() - start < 3.0
        assert cache.stats.counters["store_retries"] >= 1
        assert cache.stats.counters["store_unreachable"] == 1
        assert cache.stats.counters["store_errors"] == 1
        assert cache.stats.counters["store_skipped"] >= 6
    finally:
        os.kill(srv.pid, signal.SIGCONT)
    try:
        time.sleep(1.6)
        assert cache.entries.fetch_task(b, "testlib/p") == ["kernel.p.0001"]
    finally:
        srv.stop()


def test_out_of_memory_and_read_only_stores_keep_reads_working(tmp_path, caches):
    from warmd.store import free_port

    srv = start_test_server(tmp_path, password="pw")
    try:
        a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
        publish_entries(caches(srv.url), a, "testlib/old", ["kernel.old.0001"])
        client = srv.client()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        full = caches(srv.url)
        assert warm(full, b, task_entries(2))["compiled"] == 4
        assert full.stats.counters["publish_failed"] >= 1 and "published" not in full.stats.counters
        assert full.entries.fetch_task(b, "testlib/old") == ["kernel.old.0001"]
        client.config_set("maxmemory", "0")
        client.replicaof("127.0.0.1", free_port())  # a replica is read-only
        replica = caches(srv.url)
        c = DirAdapter(tmp_path / "c")
        assert warm(replica, c, task_entries(2, prefix="ro"))["compiled"] == 4
        # Learnt from the refused claim: nothing is even tried to publish (each of the 4
        # entries as it is built, then the 2 tasks' records).
        assert replica.read_only and replica.stats.counters["publish_skipped"] == 6
        assert replica.entries.fetch_task(c, "testlib/old") == ["kernel.old.0001"]
        client.replicaof("NO", "ONE")
        client.close()
    finally:
        srv.stop()
