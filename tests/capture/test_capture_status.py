"""`warmd status` on runtime JIT: per node count, last kernel and when, the cluster total,
the --json list, and --fail-on-runtime-jit (node records read from a real Redis, no Ray)."""

from __future__ import annotations

import json
import time

from store_support import start_test_server

from tests.cluster_support import private_machine, warmd
from warmd.cluster import state as st
from warmd.cluster.state import NodeState, node_records

EVENT = {"library": "triton", "entry": "A" * 52, "node": "gpu-1", "at": time.time(),
         "seconds": None}


def records() -> list[NodeState]:
    jit = NodeState("a" * 56, name="gpu-1", gpus=8, gpu_type="H200", state=st.READY,
                    heartbeat=time.time(), runtime_jit={"triton": 1, "flashinfer": 1},
                    runtime_jit_events=[{**EVENT, "library": "flashinfer", "entry": "silu",
                                         "at": EVENT["at"] - 5}, EVENT])
    clean = NodeState("b" * 56, name="gpu-2", gpus=8, gpu_type="H200", state=st.READY,
                      heartbeat=time.time())
    return [jit, clean]


def test_status_shows_runtime_jit_per_node_and_in_total():
    from warmd.cli.daemon import render_status, status_code
    from warmd.cluster.status import StatusSnapshot

    data = {"running": True, "source": "ray", "ray_address": "10.0.0.1:6379",
            "nodes": [r.to_json() for r in records()], "controller": {"node_id": "c" * 56},
            "store_size": None}
    snap = StatusSnapshot.from_json(data)
    text = render_status(snap, 200)
    # a note under the table for each node that had any (the table keeps its width)
    assert f"gpu-1 aaaaaaaa READY: runtime JIT: 2 (last: triton {'A' * 52} at " in text
    assert "gpu-2 bbbbbbbb READY: runtime JIT" not in text
    assert any(line.startswith("Runtime JIT (after READY)") and line.endswith(" 2")
               for line in text.splitlines())
    summary = snap.to_json()
    assert status_code(snap, fail_on_runtime_jit=False) == 0
    assert status_code(snap, fail_on_runtime_jit=True) == 1
    clean = StatusSnapshot.from_json({**data, "nodes": data["nodes"][1:]})
    assert status_code(clean, fail_on_runtime_jit=True) == 0
    assert summary["totals"]["runtime_jit"] == 2
    assert [(e["library"], e["node"]) for e in summary["runtime_jit"]] == [
        ("flashinfer", "gpu-1"), ("triton", "gpu-1")]


def test_fail_on_runtime_jit_says_why_from_the_records_in_redis(tmp_path):
    """Without Ray, status reads the node records from Redis (and exits 1: no controller);
    the exit 0 of a clean cluster is in tests/capture/test_capture_cluster.py."""
    server = start_test_server(tmp_path)
    try:
        store = node_records(server.url, "canary")
        jit, clean = records()
        assert store.put(clean)
        with private_machine(tmp_path / "home") as env:
            args = ("status", "--redis", server.url, "--namespace", "canary")
            quiet = warmd(env, *args, "--fail-on-runtime-jit")
            assert "runtime JIT" not in quiet.stderr
            assert store.put(jit)
            plain = warmd(env, *args)
            assert "runtime JIT: 2 (last: triton" in plain.stdout and plain.stderr == ""
            failing = warmd(env, *args, "--fail-on-runtime-jit", "--json")
            assert failing.returncode == 1
            assert failing.stderr.strip() == \
                "warmd: 2 kernel(s) compiled after READY (runtime JIT)"
            assert json.loads(failing.stdout)["totals"]["runtime_jit"] == 2
        store.close()
    finally:
        server.stop()
