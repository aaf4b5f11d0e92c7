"""The controller's reconcile and the agent's retry backoff, as plain code: no Ray, no sleeps.
(The same logic runs on a live cluster in test_cluster_daemon.py.)"""

from __future__ import annotations

import subprocess
import sys

from warmd.cluster.decisions import (
    BUSY,
    DEAD,
    HEALTHY,
    UNAVAILABLE,
    Forget,
    Health,
    Reconfigure,
    Record,
    Replace,
    RetryBackoff,
    Spawn,
    reconcile,
)
from warmd.cluster.nodes import RayNode

HASH = "cfg1"


def node(node_id: str, gpus: int = 1) -> RayNode:
    return RayNode(node_id=node_id, ip="10.0.0.1", alive=True, gpus=gpus, gpu_type="H200")


def healthy(node_id: str, target_hash: str = HASH) -> Health:
    return Health(HEALTHY, {"node_id": node_id, "state": "READY", "target_hash": target_hash})


def test_the_decisions_import_no_ray():
    probe = "import sys, warmd.cluster.decisions; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_new_cluster_gets_one_agent_per_wanted_node():
    a, b = node("a"), node("b")
    assert reconcile({"a": a, "b": b}, {}, {}, HASH) == [Spawn(a), Spawn(b)]


def test_a_steady_cluster_only_keeps_records():
    agents = {"a": healthy("a"), "b": healthy("b")}
    actions = reconcile({"a": node("a"), "b": node("b")}, agents, {}, HASH)
    assert actions == [Record("a", agents["a"].record), Record("b", agents["b"].record)]


def test_a_node_that_left_is_forgotten_with_its_record():
    actions = reconcile({"a": node("a")}, {"a": healthy("a"), "gone": healthy("gone")},
                        {"a": {}, "gone": {}, "stale": {}}, HASH)
    assert actions[:2] == [Forget("gone"), Forget("stale")]
    assert Record("gone", healthy("gone").record) not in actions  # never kept again


def test_a_dead_agent_is_replaced_and_respawned_the_round_after():
    first = reconcile({"a": node("a")}, {"a": Health(DEAD, detail="killed")}, {"a": {}}, HASH)
    assert first == [Replace("a", "killed")]  # its name is released before the new one
    # the controller dropped the handle: next round the node has no agent
    assert reconcile({"a": node("a")}, {}, {"a": {}}, HASH) == [Spawn(node("a"))]


def test_busy_or_unreachable_agents_are_asked_again_not_replaced():
    agents = {"a": Health(BUSY), "b": Health(UNAVAILABLE, detail="node restarting")}
    assert reconcile({"a": node("a"), "b": node("b")}, agents, {}, HASH) == []


def test_an_agent_on_an_old_config_is_reconfigured():
    agents = {"a": healthy("a", "old"), "b": healthy("b")}
    actions = reconcile({"a": node("a"), "b": node("b")}, agents, {}, HASH)
    assert Reconfigure("a") in actions and Reconfigure("b") not in actions
    assert actions.index(Record("a", agents["a"].record)) < actions.index(Reconfigure("a"))


def test_a_node_no_longer_selected_is_forgotten_even_when_healthy():
    actions = reconcile({}, {"a": healthy("a")}, {"a": {}}, HASH)
    assert actions == [Forget("a")]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_retry_backoff_doubles_up_to_the_maximum_and_resets_on_success():
    clock = Clock()
    retry = RetryBackoff(30.0, 100.0, clock)
    assert retry.due()  # never failed
    assert [retry.failed() for _ in range(4)] == [30.0, 60.0, 100.0, 100.0]
    assert not retry.due()
    clock.now += 99.9
    assert not retry.due()
    clock.now += 0.1
    assert retry.due()
    retry.succeeded()
    assert retry.failed() == 30.0  # a later failure starts over
    assert retry.retry_at == clock.now + 30.0


def test_controller_reconciles_early_only_when_the_alive_nodes_change():
    from warmd.cluster.decisions import nodes_changed

    assert not nodes_changed({"a", "b"}, ["b", "a"])
    assert nodes_changed({"a", "b"}, ["a", "b", "c"])  # a node joined
    assert nodes_changed({"a", "b"}, ["a"])  # one left
