"""The daemon's parts that need no Ray cluster: node state machine and its Redis records (real
server), node selection, summaries, logs, status rendering (metrics: test_cluster_metrics.py)."""

from __future__ import annotations

import io
import json
import time

import pytest

from warmd.cluster import state as st
from warmd.cluster.address import reachable, resolve_address
from warmd.cluster.logs import node_logger
from warmd.cluster.nodes import RayNode, wanted_nodes
from warmd.cluster.state import NodeState, node_records
from warmd.cluster.work import NodeWarm, node_context, summarize, warm_node
from warmd.config.parse import parse_config
from warmd.errors import WarmdInputError
from warmd.store import free_port, layout, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = start_server(tmp_path_factory.mktemp("redis"), password="unit-pw", appendonly=False)
    yield proc
    proc.stop()


def test_state_machine_allows_only_documented_moves():
    node = NodeState("n")
    node.transition(st.WARMING)
    node.transition(st.READY)
    node.transition(st.WARMING)  # config changed
    node.transition(st.FAILED, "model x: not found")
    assert node.reason == "model x: not found"
    with pytest.raises(st.BadTransition):
        node.transition(st.READY)  # a failed node must warm again first
    with pytest.raises(st.BadTransition):
        NodeState("m").transition(st.READY)
    node.kernels = {"total": 4, "local_hits": 1, "remote_hits": 2, "compiled": 1, "failed": 0}
    again = NodeState.from_json(json.loads(json.dumps(node.to_json())))
    assert again == node and again.hit_rate == 0.75


def test_state_store_roundtrip_on_a_real_server(server):
    store = node_records(server.url, "ns1", ttl=30)
    other = node_records(server.url, "ns2")
    assert store.put(NodeState("a", state=st.READY)) and store.put(NodeState("b"))
    assert other.put(NodeState("c"))
    assert {n.node_id: n.state for n in store.get_all()} == {"a": st.READY, "b": st.PENDING}
    assert 0 < server.client().ttl(layout.node_key("ns1", "a")) <= 30  # dead agents' records expire
    assert store.delete("b") and [n.node_id for n in store.get_all()] == ["a"]
    assert [n.node_id for n in other.get_all()] == ["c"]
    assert store.put_daemon({"config_hash": "abc"}) and store.get_daemon() == {
        "config_hash": "abc"}
    assert store.server_size()["keys"] >= 3 and store.ping() and store.healthy
    assert store.delete_daemon() and store.get_daemon() is None


def test_state_store_degrades_when_redis_is_unreachable():
    store = node_records(f"redis://127.0.0.1:{free_port()}/0", "ns")
    started = time.monotonic()
    assert store.put(NodeState("a")) is False
    assert store.get_all() is None and store.get_daemon() is None
    assert store.server_size() is None and not store.ping()
    assert time.monotonic() - started < 5  # bounded timeouts, no hidden retries
    assert store.errors == 5 and "ConnectionError" in store.last_error and not store.healthy
    off = node_records("off", "ns")
    assert off.put(NodeState("a")) is False and off.errors == 0
    assert off.last_error == "no Redis configured"


def test_state_store_never_shows_the_password(server):
    bad = node_records(server.url.replace("unit-pw", "wrong-pw"), "ns")
    assert bad.put(NodeState("a")) is False
    assert "wrong-pw" not in bad.last_error and bad.last_error


def ray_node(node_id, gpus=0, accel=None, labels=None, alive=True, head=False) -> dict:
    resources = {"CPU": 4.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if accel:
        resources[f"accelerator_type:{accel}"] = 1.0
    if head:
        resources["node:__internal_head__"] = 1.0
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.1",
            "Resources": resources, "Labels": labels or {}}


def test_node_selection():
    nodes = [RayNode.from_ray(n) for n in (
        ray_node("head", head=True), ray_node("h200", 8, "H200", {"pool": "gpu"}),
        ray_node("h100", 8, "H100", {"pool": "gpu"}), ray_node("dead", 8, "H200", alive=False),
        ray_node("labelled", 8, labels={"ray.io/accelerator-type": "H200", "pool": "gpu"}))]
    assert nodes[0].is_head and nodes[0].role() == "builder"
    assert nodes[4].gpu_type == "H200" and nodes[1].to_json()["role"] == "gpu"
    config = parse_config({"models": [{"path": "x"}],
                           "nodes": {"labels": {"pool": "gpu"}, "gpu_types": ["H200"]}})
    assert set(wanted_nodes(nodes, config)) == {"h200", "labelled"}
    everything = parse_config({"models": [{"path": "x"}], "builders": {"enabled": True}})
    assert set(wanted_nodes(nodes, everything)) == {"head", "h200", "h100", "labelled"}


def shard(models, store=None, sizes=None) -> NodeWarm:
    return NodeWarm.from_json({"models": models, "store": store or {"ok": True, "reason": ""},
                               "cache_bytes": sizes or {}})


def model(name, ok=True, reason="", **counters) -> dict:
    base = {"tasks": 1, "local_hits": 0, "remote_hits": 0, "compiled": 0, "failed": 0,
            "compile_seconds": 0.0, "compile_seconds_saved": 0.0}
    return {"name": name, "plan_key": f"key-{name}", "ok": ok, "reason": reason,
            "counters": {**base, **counters}}


def test_summaries_of_worker_results():
    ready = summarize([shard([model("a", compiled=1, compile_seconds=6.5)], sizes={"fi": 10}),
                       shard([model("a", remote_hits=2, compile_seconds_saved=4.0)],
                             sizes={"fi": 12})]).to_json()
    assert ready["state"] == "READY" and ready["plans"] == {"a": "key-a"}
    assert ready["kernels"] == {"total": 3, "local_hits": 0, "remote_hits": 2, "compiled": 1,
                                "failed": 0}
    assert ready["compile_seconds"] == 6.5 and ready["saved_seconds"] == 4.0
    assert ready["cache_bytes"] == {"fi": 12} and ready["hit_rate"] == round(2 / 3, 4)
    degraded = summarize([shard([model("a", local_hits=1)],
                                {"ok": False, "reason": "shared cache unreachable"})]).to_json()
    assert degraded["state"] == "DEGRADED" and "unreachable" in degraded["reason"]
    failed = summarize([shard([model("a", False, "model a: not found"), model("b")],
                              {"ok": False, "reason": "unreachable"})]).to_json()
    assert failed["state"] == "FAILED" and failed["reason"] == "model a: not found"


def test_warm_node_fails_a_missing_model_and_skips_gpu_only_work_on_builders(tmp_path):
    config = parse_config({"models": [
        {"name": "gone", "path": str(tmp_path / "nowhere"), "target": "h200"},
        {"name": "dg", "path": "deepseek-v3", "target": "h200", "libraries": ["deep_gemm"]}]})
    seen = []
    result = warm_node(config, node_context(config), builder=True, redis_url="off",
                       progress=lambda *a: seen.append(a))
    [gone] = result.to_json()["models"]  # a builder has nothing to do for a DeepGEMM-only model
    assert gone["name"] == "gone" and not gone["ok"]
    assert gone["reason"] == f"model gone: model config not found: {tmp_path / 'nowhere'}"
    assert summarize([result]).state == "FAILED" and seen == []


def test_logs_are_json_lines_with_the_node_id():
    stream = io.StringIO()
    log = node_logger("unit-test", "abc123", stream=stream)
    log.info("warmed %d kernels", 3, extra={"state": "READY"})
    entry = json.loads(stream.getvalue().splitlines()[-1])
    assert entry["msg"] == "warmed 3 kernels" and entry["node_id"] == "abc123"
    assert entry["state"] == "READY" and entry["component"] == "unit-test"


def test_status_rendering_and_matching():
    from warmd.cli.daemon import render_status
    from warmd.cluster.status import StatusSnapshot

    nodes = [NodeState("a" * 56, ip="10.0.0.7", gpus=8, gpu_type="H200", state=st.READY,
                       kernels={"total": 2, "local_hits": 1, "remote_hits": 1, "compiled": 0,
                                "failed": 0}, warmed_at=time.time(), warm_seconds=3.0,
                       heartbeat=time.time(),
                       counters={"local_hits": 1, "remote_hits": 1, "compile_seconds_saved": 9.0,
                                 "tasks": 2}).to_json(),
             NodeState("b" * 56, ip="10.0.0.8", role="builder", state=st.FAILED,
                       reason="model m: model config not found: /m",
                       heartbeat=time.time() - 600).to_json()]
    snap = {"running": True, "source": "ray", "ray_address": "10.0.0.1:6379", "nodes": nodes,
            "controller": {"node_id": "c" * 56, "started_at": time.time(), "config_hash": "h",
                           "redis": "redis://w:***@r:6379/0", "config": {"redis": {
                               "namespace": "prod"}}},
            "store_size": {"used_memory": 3 << 20, "keys": 42}}
    snap = StatusSnapshot.from_json(snap)
    text = render_status(snap)
    assert "aaaaaaaa  10.0.0.7  8x H200  READY" in text
    assert "bbbbbbbb FAILED: model m: model config not found: /m" in text
    assert "no heartbeat for 600s" in text or "no heartbeat for 601s" in text
    assert "Hit rate                       100.0 %" in text and "3.0 MiB, 42 keys" in text
    summary = snap.to_json()
    assert summary["ready"] is False and summary["totals"]["compile_seconds_saved"] == 9.0
    assert snap.nodes[0].matches("aaaa") and snap.nodes[0].matches("10.0.0.7")
    assert not snap.nodes[0].matches("10.0.0.8")


def test_ray_addresses_are_checked_before_connecting():
    port = free_port()
    assert reachable(f"127.0.0.1:{port}") == "Connection refused"
    with pytest.raises(WarmdInputError, match=f"cannot reach a Ray cluster at 127.0.0.1:{port}"):
        resolve_address(f"127.0.0.1:{port}")
    with pytest.raises(WarmdInputError, match="expected HOST:PORT"):
        resolve_address("nonsense")


def test_a_config_that_selects_no_node_says_why_and_what_to_change():
    from warmd.cluster.nodes import selection_problem

    cpu = RayNode("c" * 56, "10.0.0.1", True, 0, None)
    h100 = RayNode("h" * 56, "10.0.0.2", True, 8, "H100", labels={"zone": "a"})
    plain = parse_config({"models": [{"path": "/m"}]})
    assert selection_problem([cpu], plain) == (
        "the config selects no node: none of the 1 node(s) has a GPU and builders are "
        "disabled; set `builders: {enabled: true}` in the config to build kernels on CPU "
        "nodes, or add GPU nodes")
    assert selection_problem([], plain) == ("the config selects no node: the Ray cluster "
                                            "has no alive node")
    assert selection_problem([cpu, h100], plain) is None
    h200 = parse_config({"models": [{"path": "/m"}], "nodes": {"gpu_types": ["H200"]}})
    assert selection_problem([cpu, h100], h200) == (
        "the config selects no node: its gpu_types ['H200'] match none of the 1 GPU node(s) "
        "(H100) and 1 CPU node(s); change `nodes:` in the config")


def test_node_name_is_stable_per_state_dir(tmp_path, monkeypatch):
    from warmd import settings

    monkeypatch.delenv("WARMD_NODE_NAME", raising=False)
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "one"))
    first = settings.node_name()
    assert first == settings.node_name() == (tmp_path / "one" / "node-id").read_text().strip()
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "two"))
    assert settings.node_name() != first  # two simulated machines on one host differ
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "one"))
    assert settings.node_name() == first
    monkeypatch.setenv("WARMD_NODE_NAME", "gpu-17")
    assert settings.node_name() == "gpu-17"


def test_status_tables_fit_the_terminal_and_never_break_ids():
    from warmd.cli.daemon import render_status
    from warmd.cli.render import Col, table_lines
    from warmd.cluster.status import StatusSnapshot

    head = (Col("NODE", "id"), Col("RAY ID"), Col("STATE"))
    rows = [("a-very-long-stable-machine-name-0123456789", "deadbeef", "READY")]
    wide = table_lines(head, rows, 200)
    assert rows[0][0] in wide[1]
    narrow = table_lines(head, rows, 40)
    assert all(len(line) <= 40 for line in narrow)
    # a name too long for the line on its own is shortened in the middle, never wrapped
    assert narrow[1].split()[0] == "a-very-lon…0123456789"
    assert "deadbeef" in narrow[1] and "READY" in narrow[1]  # cut, never wrapped
    with_more = (*head, Col("LAST WARM", dropped=True))
    dropped = table_lines(with_more, [(*rows[0], "12:00:00 (3.0s)")], 70)
    assert rows[0][0] in dropped[1] and "LAST WARM" not in dropped[0]  # a column goes first

    record = NodeState("e" * 56, name="host-with-a-rather-long-name-1234", ip="10.0.0.9",
                       state=st.FAILED, reason="model m: " + "x" * 200).to_json()
    snap = StatusSnapshot.from_json({
        "running": True, "source": "ray", "ray_address": "10.0.0.1:6379", "nodes": [record],
        "controller": {"node_id": "c" * 56}, "store_size": None})
    for width in (60, 100, 160):
        table = render_status(snap, width).split("Nodes (")[1].split("Cluster totals")[0]
        assert all(len(line) <= width for line in table.splitlines()), width
        [row] = [line for line in table.splitlines() if line.startswith(" host")]
        assert "eeeeeeee" in row and "FAILED" in row  # ids and states are never cut
        assert "10.0.0.9" in row
        if width >= 80:
            assert "host-with-a-rather-long-name-1234" in row  # columns go, names stay
        reason = "".join(line.strip() for line in table.splitlines() if "x" * 10 in line)
        assert reason.count("x") == 200  # the reason whole, wrapped


def test_status_of_a_stopped_daemon_is_two_lines(tmp_path):
    from warmd.cli.daemon import render_stopped
    from warmd.cluster.status import StatusSnapshot

    base = {"running": False, "source": "none", "nodes": [], "controller": None,
            "ray_address": None}
    text = render_stopped(StatusSnapshot.from_json(
        {**base, "redis": "redis://h:6379/0", "store_size": {"used_memory": 2 << 20,
                                                             "keys": 7}}))
    assert text.splitlines() == [
        "warmd is not running (no Ray cluster found); start it with `warmd start`",
        "shared cache redis://h:6379/0: 7 keys, 2.0 MiB; its counters: `warmd cache stats`"]
    kept = render_stopped(StatusSnapshot.from_json({**base, "redis": None, "store_size": None,
                                                    "embedded_dir": str(tmp_path)}))
    assert f"its data is kept in {tmp_path}" in kept.splitlines()[1]


def test_watch_interval_is_bounded_and_signals_end_it_cleanly(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from cluster_support import private_machine, warmd, warmd_popen

    with private_machine(tmp_path / "home") as env:
        for interval in ("0", "0.1", "-1", "nan"):
            done = warmd(env, "status", "--watch", "--interval", interval, timeout=60)
            assert done.returncode == 2 and done.stdout == ""
            [line] = done.stderr.splitlines()
            assert "--interval" in line and ">= 0.5" in line, line
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            shown = tmp_path / f"watch-{signum}.txt"
            with open(shown, "w") as out:
                watch = warmd_popen(env, "status", "--watch", "--interval", "0.5", stdout=out,
                                    stderr=subprocess.PIPE,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                     signal.SIG_IGN))
                deadline = time.monotonic() + 60
                while shown.read_text().count("warmd is not running") < 2:
                    assert watch.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
                os.kill(watch.pid, signum)
                _, err = watch.communicate(timeout=30)
            assert watch.returncode == code and err == "", (sys.platform, err)
