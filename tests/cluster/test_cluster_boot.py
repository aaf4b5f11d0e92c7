"""Cluster boot with real processes and a real redis-server: nodes cold at once split the
kernels (each compiled once in the cluster, each node compiling some), and a node killed
while it holds claims has its kernels compiled elsewhere within seconds, the others still
finishing every task."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from store_support import compiles, node_result, spawn_node, start_test_server, task_entries


@pytest.fixture
def server(tmp_path):
    srv = start_test_server(tmp_path)
    yield srv
    srv.stop()




def test_cold_nodes_split_the_kernels_each_compiled_once(server, tmp_path):
    plan = task_entries(3, per_task=4)  # 12 kernels, few tasks: the kernel is the unit
    procs = [spawn_node(server, tmp_path, f"node-{i}", plan, seconds=0.4) for i in range(3)]
    results = [node_result(p) for p in procs]
    every = sorted(n for names in plan.values() for n in names)
    assert sorted(compiles(tmp_path / "compiles.log")) == every  # once each, cluster-wide
    assert sum(r["counts"]["compiled"] for r in results) == len(every)
    assert all(r["counts"]["compiled"] + r["counts"]["remote_hits"] == len(every)
               for r in results)
    # Three nodes, three tasks' worth of kernels: every node compiled some.
    assert all(r["counts"]["compiled"] >= 2 for r in results), results


def test_a_killed_claimer_s_kernels_are_compiled_elsewhere_within_seconds(server, tmp_path):
    plan = task_entries(2, per_task=3)
    log = tmp_path / "compiles.log"
    victim = spawn_node(server, tmp_path, "victim", plan, seconds=60)
    deadline = time.monotonic() + 60
    while not compiles(log, "start"):  # it holds a claim and is compiling under it
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.05)
    held_by_victim = set(compiles(log, "start"))  # its worker logs each start (one worker)
    others = [spawn_node(server, tmp_path, f"node-{i}", plan, seconds=0.2) for i in range(2)]
    client = server.client()
    while not client.pubsub_channels("warmd:v1:kpub:*"):  # one found the claim held: waits
        assert time.monotonic() < deadline and all(p.poll() is None for p in others)
        time.sleep(0.05)
    client.close()
    time.sleep(3.5)  # longer than the claim's TTL: the victim's renewals keep it
    assert not held_by_victim & set(compiles(log, "done"))
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.communicate()
    while not held_by_victim <= set(compiles(log, "done")):
        assert time.monotonic() - killed < 10.0, "a dead claimer's kernel waited 10 s"
        time.sleep(0.05)
    results = [node_result(p) for p in others]  # both finish every task (their warm asserts)
    every = Counter(n for names in plan.values() for n in names)
    done = Counter(compiles(log, "done"))
    assert set(done) == set(every) and all(v == 1 for v in done.values())
    assert sum(r["store"].get("lease_takeovers", 0) for r in results) >= len(held_by_victim)
