"""What operators see of a cluster boot: each node's kernels compiled here, installed from
peers and waited for, in `warmd status` (a line per node) and `--json` (`boot`, which `warmd
start --json` carries in its status); summed over a node's models."""

from __future__ import annotations

import json

from warmd.cli.status_view import boot_note, render_status
from warmd.cluster.state import NodeState
from warmd.cluster.status import StatusSnapshot
from warmd.cluster.work import ModelResult, NodeWarm, summarize
from warmd.coordination import BootReport
from warmd.stats import Counters


def _node(name: str, boot: dict, warmed_at: float, seconds: float) -> dict:
    return {"node_id": f"{name}0000000000", "name": name, "state": "READY", "gpus": 1,
            "kernels": {"total": boot["compiled"] + boot["installed"],
                        "compiled": boot["compiled"], "remote_hits": boot["installed"],
                        "local_hits": 0, "failed": 0},
            "warmed_at": warmed_at, "warm_seconds": seconds, "boot": boot}


BOOT_A = {"compiled": 30, "installed": 28, "waited": 2, "took_over": 1, "failed": 0,
          "wait_seconds": 3.14, "timeline": {"first_compile": 0.2, "ended": 26.0}}
BOOT_B = {"compiled": 28, "installed": 30, "waited": 0, "took_over": 0, "failed": 0,
          "wait_seconds": 0.0, "timeline": {"first_compile": 0.1, "ended": 25.0}}


def test_each_node_says_what_it_did_of_the_cluster_s_work():
    snap = StatusSnapshot.from_json({"running": True, "source": "ray", "nodes": [
        _node("a", BOOT_A, 1000.0, 26.0), _node("b", BOOT_B, 999.0, 24.0)]})
    boot = snap.to_json()["boot"]
    assert {k: boot[k] for k in ("compiled", "installed", "waited", "took_over")} == \
        {"compiled": 58, "installed": 58, "waited": 2, "took_over": 1}
    assert boot["span_seconds"] == 1000.0 - (1000.0 - 26.0)  # first start to last end
    assert [n["compiled"] for n in boot["nodes"]] == [30, 28]
    assert boot["nodes"][0]["timeline"] == BOOT_A["timeline"]
    text = render_status(snap, width=80)
    assert ("a a0000000 READY: cluster: 30 compiled here, 28 from peers, 2 waited for "
            "(3.1 s), 1 taken over b b0000000") in " ".join(text.split())
    assert all(len(line) <= 80 for line in text.splitlines())
    assert boot_note(None) is None
    assert boot_note(BootReport.from_json({**BOOT_B, "compiled": 0, "installed": 0})) is None


def test_a_node_s_models_sum_into_its_boot():
    total = BootReport()
    total.add(BootReport.from_json(BOOT_A))
    total.add(BootReport.from_json(BOOT_B))
    assert total.compiled == 58 and total.waited == 2 and total.wait_seconds == 3.14
    assert total.timeline == {"first_compile": 0.2, "ended": 26.0}  # the later moment


def test_a_boot_report_reads_back_from_its_json_as_it_was():
    boot = BootReport(compiled=3, installed=2, waited=1, took_over=1, failed=1,
                      wait_seconds=1.23456, timeline={"claims_began": 0.5, "ended": None})
    data = json.loads(json.dumps(boot.to_json()))
    assert list(data) == ["compiled", "installed", "waited", "took_over", "failed",
                          "wait_seconds", "timeline"]
    assert data["wait_seconds"] == 1.235  # to the millisecond, as --json prints it
    again = BootReport.from_json(data)
    assert again == BootReport(3, 2, 1, 1, 1, 1.235, {"claims_began": 0.5, "ended": None})
    assert again.to_json() == data


def test_the_boot_crosses_ray_and_redis_as_json_and_is_typed_either_side():
    model = ModelResult("a", "key-a", tasks=2, counters=Counters(compiled=2, compile_seconds=1.5),
                        boot=BootReport.from_json(BOOT_A))
    worker = NodeWarm.from_json(json.loads(json.dumps(NodeWarm([model]).to_json())))
    assert worker.models == [model]  # what a Ray worker answered, read back
    summary = summarize([worker, NodeWarm([ModelResult("b", boot=BootReport.from_json(BOOT_B))])])
    assert summary.to_json()["boot"] == {**BOOT_A, "compiled": 58, "installed": 58}
    node = NodeState("n" * 56, boot=summary.boot)
    record = json.loads(json.dumps(node.to_json()))  # a node record, as Redis keeps it
    assert record["boot"] == summary.to_json()["boot"]
    assert NodeState.from_json(record).boot == summary.boot


def test_a_model_without_a_warmup_or_a_shared_cache_says_so_with_empty_json():
    data = ModelResult("gone", ok=False, reason="not found").to_json()
    assert data["counters"] == {} and data["boot"] == {}
    again = ModelResult.from_json(data)
    assert again.counters is None and again.boot is None
    assert summarize([NodeWarm([again])]).to_json()["boot"] == {}
    assert NodeState("n").to_json()["boot"] == {} and NodeState.from_json(
        NodeState("n").to_json()).boot is None
