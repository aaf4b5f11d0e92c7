"""What `warmd start` checks before it starts anything, and when it may say the nodes are
warm: only for the configuration it just applied (the Ray story: test_cluster_quickstart)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from warmd.cli import main
from warmd.cluster.status import StatusSnapshot


def _snap(reconciled: str, nodes: list[dict] | None = None, no_node: str = "") -> StatusSnapshot:
    return StatusSnapshot.from_json({
        "running": True, "source": "ray", "nodes": nodes or [],
        "controller": {"config_hash": "new", "reconciled_hash": reconciled, "no_node": no_node,
                       "counters": {"reconciles": 7}}})


def test_no_node_counts_only_after_a_reconcile_with_the_current_config():
    # the previous config selected nothing; the new one was applied, no round ran with it
    stale = _snap("old", no_node="no builders")
    assert stale.settled(None) is None and stale.no_node is None
    done = _snap("new", no_node="no builders")
    assert done.settled(None) is True and done.no_node == "no builders"
    # nodes warm for the previous config are not warm for this one
    old_node = {"node_id": "a" * 56, "state": "READY", "config_hash": "old"}
    assert _snap("new", [old_node]).settled(None) is None
    assert _snap("new", [{**old_node, "config_hash": "new"}]).settled(None) is True


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A state dir and a Ray temp dir of its own: no cluster of anyone else is found."""
    for name in ("RAY_ADDRESS", "WARMD_REDIS_URL", "WARMD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))
    return tmp_path


@pytest.mark.parametrize("model", [
    {"path": "/no/such/model"},
    {"engine_command": "vllm serve /no/such/model --tensor-parallel-size 2"},
])
def test_start_refuses_a_model_missing_here_before_starting_ray(machine, model):
    pytest.importorskip("ray")
    config = machine / "warmd.yaml"
    config.write_text(json.dumps({"version": 1, "models": [model]}))
    result = CliRunner().invoke(main, ["start", "--config", str(config)])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line == f"warmd: error: {config}: models[0]: model config not found: /no/such/model"
    state = machine / "state"
    assert not (state / "ray-head.log").exists() and not (state / "daemon.json").exists()
    assert not (state / "redis").exists()  # nor the embedded store
