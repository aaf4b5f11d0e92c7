"""Several warmup processes sharing one real redis-server: remote hits, compile-once,
and a lease holder killed mid-compile."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from store_support import compiles, node_result, spawn_node, start_test_server, task_entries


@pytest.fixture
def server(tmp_path):
    srv = start_test_server(tmp_path, password="mp-pw")
    yield srv
    srv.stop()




def test_second_process_compiles_nothing(server, tmp_path):
    plan = task_entries(6)
    first = node_result(spawn_node(server, tmp_path, "node-a", plan))
    assert first["counts"]["compiled"] == 12
    second = node_result(spawn_node(server, tmp_path, "node-b", plan))
    assert second["counts"] == {"local_hits": 0, "remote_hits": 12, "compiled": 0}
    assert second["store"]["remote_hits"] == 12 and second["store"]["tasks_hit"] == 6
    assert Counter(compiles(tmp_path / "compiles.log")) == Counter(
        n for names in plan.values() for n in names)


def test_concurrent_cold_warmups_compile_each_kernel_once(server, tmp_path):
    plan = task_entries(8)
    procs = [spawn_node(server, tmp_path, f"node-{i}", plan, seconds=0.3) for i in range(3)]
    results = [node_result(p) for p in procs]
    built = compiles(tmp_path / "compiles.log")
    assert sorted(built) == sorted(n for names in plan.values() for n in names)  # once each
    assert sum(r["counts"]["compiled"] for r in results) == 16
    assert all(r["counts"]["compiled"] + r["counts"]["remote_hits"] == 16 for r in results)
    # Sharded: more than one process did compile work.
    assert sum(1 for r in results if r["counts"]["compiled"]) >= 2


def test_killed_lease_holder_is_taken_over(server, tmp_path):
    plan = task_entries(1, per_task=1)
    (name,) = next(iter(plan.values()))
    holder = spawn_node(server, tmp_path, "holder", plan, seconds=60, lease_seconds=1.5)
    log = tmp_path / "compiles.log"
    deadline = time.monotonic() + 30
    while name not in compiles(log, "start"):
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.05)
    waiter = spawn_node(server, tmp_path, "waiter", plan, lease_seconds=1.5)
    client = server.client()
    while not client.pubsub_channels("warmd:v1:kpub:*"):  # the waiter subscribed: it waits
        assert time.monotonic() < deadline and waiter.poll() is None
        time.sleep(0.05)
    time.sleep(2.0)  # longer than the claim's TTL: the holder's renewals keep it
    assert waiter.poll() is None
    client.close()
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    result = node_result(waiter)
    assert result["counts"]["compiled"] == 1
    assert result["store"]["lease_waits"] == 1 and result["store"]["lease_takeovers"] == 1
    assert compiles(log) == [name]  # the holder never finished; the waiter did, once
    assert not (tmp_path / "holder" / name / "done").exists()
