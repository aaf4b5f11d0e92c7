"""Joins at fleet scale, against a real redis-server: a slow store is retried within the
join budget instead of turning into compiles, reads go in bounded windows, a warm join
writes little (TTL renewals once per interval per plan, stats in one flush), and what an
install wrote is not hashed again."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from store_support import DirAdapter, entry_bytes, module_server, start_test_server, warm

from warmd.cache import install
from warmd.cache.records import entry_digest
from warmd.errors import WarmdInputError
from warmd.store import layout, parse_store_url
from warmd.store.blobs import READ_WINDOW_BYTES
from warmd.store.breaker import JoinBudget

server = module_server()


def plan_of(tasks: int, per_task: int = 3, prefix: str = "f") -> dict[str, list[str]]:
    return {f"testlib/fleet/{t}": [f"kernel.{prefix}{t}_{i}.{t:04x}{i:04x}"
                                   for i in range(per_task)] for t in range(tasks)}


def published(caches, url: str, root: Path, plan: dict, size: int = 20_000) -> None:
    counts = warm(caches(url, node="publisher"), DirAdapter(root), plan, size=size)
    assert counts["compiled"] == sum(len(v) for v in plan.values())


# --- a timeout is not a miss --------------------------------------------------------------

def test_join_budget_backs_off_with_jitter_and_runs_out():
    now = [0.0]
    budget = JoinBudget(20.0, clock=lambda: now[0])
    waits = []
    for attempt in range(6):
        wait = budget.failed(attempt)
        assert wait is not None and 0 <= wait <= min(2.0, 0.05 * 2 ** attempt)
        waits.append(wait)
        now[0] += wait + 0.5  # the failed call's own time counts too
    assert len(set(waits)) > 1  # jittered
    budget.succeeded()  # trouble over: what it took stays spent
    spent = 20.0 - budget.remaining()
    assert spent == pytest.approx(now[0], abs=1e-6)
    now[0] += 100  # time without trouble costs nothing
    assert budget.remaining() == pytest.approx(20.0 - spent)
    while budget.failed(0) is not None:
        now[0] += 1.0
    assert budget.exhausted and budget.remaining() == 0


def test_a_store_that_answers_late_is_waited_for_not_compiled_around(tmp_path, caches):
    """The store stops answering (SIGSTOP) for 2.5 s, five times the operation timeout,
    while a node joins: the node retries and installs everything; nothing is compiled."""
    srv = start_test_server(tmp_path / "s")
    plan = plan_of(4)
    try:
        published(caches, srv.url, tmp_path / "a", plan)
        cache = caches(srv.url, node="late", socket_timeout=0.5, join_budget=30.0)
        os.kill(srv.pid, signal.SIGSTOP)
        resume = threading.Timer(2.5, os.kill, (srv.pid, signal.SIGCONT))
        resume.start()
        try:
            counts = warm(cache, DirAdapter(tmp_path / "b"), plan)
        finally:
            resume.join()
            os.kill(srv.pid, signal.SIGCONT)
        assert counts == {"local_hits": 0, "remote_hits": 12, "compiled": 0}
        assert cache.stats.counters["store_retries"] >= 1
        assert "store_unreachable" not in cache.stats.counters
        assert "store_errors" not in cache.stats.counters
    finally:
        srv.stop()


# --- bounded reads --------------------------------------------------------------------------

def test_reads_fit_a_small_reply_buffer(server, rclient, caches, tmp_path):
    """A server that drops any normal client whose reply buffer passes 3 MB (client-output-
    buffer-limit) still serves a plan of 18 MB: no pipeline asks for more than the window."""
    assert READ_WINDOW_BYTES <= 2 << 20
    plan = plan_of(4, per_task=3, prefix="big")
    published(caches, server.url, tmp_path / "a", plan, size=1_500_000)
    before = rclient.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    rclient.config_set("client-output-buffer-limit", "normal 3mb 3mb 0")
    try:
        reader = caches(server.url, node="reader")
        counts = warm(reader, DirAdapter(tmp_path / "b"), plan, size=1_500_000)
    finally:
        rclient.config_set("client-output-buffer-limit", before)
    assert counts["remote_hits"] == 12 and counts["compiled"] == 0
    assert "store_errors" not in reader.stats.counters
    assert "store_retries" not in reader.stats.counters


# --- reads stay reads -----------------------------------------------------------------------

def _calls(client) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}


def _writes(calls: dict[str, int]) -> int:
    read_only = {"get", "getrange", "ping", "info", "config|resetstat", "hello", "client|setinfo",
                 "command|info", "evalsha", "script|load", "zrange", "exists"}
    return sum(v for k, v in calls.items() if k not in read_only)


def test_a_warm_join_writes_a_tenth_of_what_it_reads(server, rclient, caches, tmp_path):
    """The plan of the fleet measurement (60 entries in 10 tasks): a warm join's writes are
    its counters (one flush) and a renewal marker, at most a tenth of its commands."""
    plan = plan_of(10, per_task=6)
    published(caches, server.url, tmp_path / "a", plan, size=5_000)
    warm(caches(server.url, node="first"), DirAdapter(tmp_path / "b"), plan,
         size=5_000)  # renews
    rclient.config_resetstat()
    for i in range(3):
        reader = caches(server.url, node=f"joiner{i}")
        assert warm(reader, DirAdapter(tmp_path / f"j{i}"), plan, size=5_000)[
            "remote_hits"] == 60
        reader.close()
    calls = _calls(rclient)
    calls.pop("config|resetstat", None)
    assert calls.get("pexpire", 0) == 0 and calls.get("zadd", 0) == 0  # renewed already
    assert "incr" not in calls and "incrby" not in calls  # nothing to spread: all warm
    assert _writes(calls) <= 0.1 * sum(calls.values()), calls


def test_what_a_plan_used_is_renewed_once_per_interval(server, rclient, caches, tmp_path):
    plan = plan_of(2)
    published(caches, server.url, tmp_path / "a", plan)
    fp = next(iter(rclient.scan_iter(match=layout.PREFIX + "fp:*"))).decode().split("{")[1][:-1]
    key = layout.manifest_key(fp, plan["testlib/fleet/0"][0])
    rclient.pexpire(key, 5000)
    first = caches(server.url, ttl_seconds=3600, node="first")
    assert first.entries.prefetch(DirAdapter(tmp_path / "b"), list(plan))["testlib/fleet/0"]
    assert rclient.pttl(key) > 3_000_000  # renewed by the first reader
    rclient.pexpire(key, 5000)
    second = caches(server.url, ttl_seconds=3600, node="second")
    assert second.entries.prefetch(DirAdapter(tmp_path / "c"), list(plan))["testlib/fleet/0"]
    assert rclient.pttl(key) <= 5000  # within the interval: nobody renews again
    (marker,) = rclient.scan_iter(match=layout.PREFIX + "renewed:*")
    assert 0 < rclient.pttl(marker) <= 360_000  # a tenth of the TTL
    rclient.delete(marker)  # the interval is over
    third = caches(server.url, ttl_seconds=3600, node="third")
    assert third.entries.prefetch(DirAdapter(tmp_path / "d"), list(plan))["testlib/fleet/0"]
    assert rclient.pttl(key) > 3_000_000


def test_replica_reads_are_asked_for_in_the_url_of_a_cluster_only():
    url = parse_store_url("redis+cluster://127.0.0.1:7000?read_from_replicas=true")
    assert url.cluster and url.read_from == "round_robin"
    assert "read_from_replicas" not in url.url and "reads: round_robin" in url.display
    url = parse_store_url("redis://127.0.0.1:7000/0?cluster=true&"
                          "load_balancing_strategy=random_replica")
    assert url.read_from == "random_replica"
    assert parse_store_url("redis+cluster://127.0.0.1:7000").read_from is None
    with pytest.raises(WarmdInputError, match="need a Redis Cluster URL"):
        parse_store_url("redis://127.0.0.1:6379/0?read_from_replicas=yes")
    with pytest.raises(WarmdInputError, match="load_balancing_strategy must be one of"):
        parse_store_url("redis+cluster://127.0.0.1:7000?load_balancing_strategy=nearest")


# --- join cost on the node ------------------------------------------------------------------

def test_what_an_install_wrote_is_not_hashed_again_unless_it_changed(tmp_path):
    src = DirAdapter(tmp_path / "src")
    entry = src.root / "kernel.x.0001"
    (entry / "sub").mkdir(parents=True)
    (entry / "kernel.bin").write_bytes(entry_bytes("x", 50_000))
    (entry / "sub" / "a").write_bytes(b"a")
    (entry / "a-b").mkdir()
    (entry / "a-b" / "c").write_bytes(b"c")  # "a-b" sorts before "a/" as text, not as paths
    (entry / "done").write_text("ok")
    blob = src.pack(src.list_entries()[0])
    dest = DirAdapter(tmp_path / "dest")
    path = dest.install("kernel.x.0001", blob).path
    known = install.installed_digest(path)
    assert known is not None and known == entry_digest(entry)
    stat = os.stat(path / "kernel.bin")
    (path / "kernel.bin").write_bytes(entry_bytes("y", 50_000))
    os.utime(path / "kernel.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime restored
    assert install.installed_digest(path) is None  # the ctime still says it changed
    assert entry_digest(path) != known
    (path / "kernel.bin").write_bytes(entry_bytes("x", 50_000))
    time.sleep(0.01)
    (path / "extra").write_bytes(b"planted")
    assert install.installed_digest(path) is None
