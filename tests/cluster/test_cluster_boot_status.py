"""What operators see of a cluster boot: each node's kernels compiled here, installed from
peers and waited for, in `warmd status` (a line per node) and `--json` (`boot`, which `warmd
start --json` carries in its status); summed over a node's models."""

from __future__ import annotations

from warmd.cli.status_view import boot_note, render_status
from warmd.cluster.status import StatusSnapshot
from warmd.cluster.work import sum_boot


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
    assert boot_note({}) is None and boot_note({**BOOT_B, "compiled": 0, "installed": 0}) \
        is None


def test_a_node_s_models_sum_into_its_boot():
    total = sum_boot(sum_boot({}, BOOT_A), BOOT_B)
    assert total["compiled"] == 58 and total["waited"] == 2 and total["wait_seconds"] == 3.14
    assert total["timeline"] == {"first_compile": 0.2, "ended": 26.0}  # the later moment
