"""The README's first command on a fresh machine: `warmd start` with no arguments starts a
local Ray cluster and the embedded Redis, warms the embedded default config (one small
FlashInfer module, built for sm_90a on this CPU-only machine) and `warmd status` shows the
node READY with its counters. A `start` whose config selects no node (exit 1, Ray and the
controller left up) followed by the default `start` waits for that config's node, never
exiting 0 early. `warmd stop` ends exactly what `start` started, no store server left
behind; a second `start` finds everything in the cache. The machine is private
(cluster_support): a daemon that already runs here (the Quickstart's first command) is
neither found nor disturbed.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")

from cluster_support import private_machine, warmd  # noqa: E402

pytestmark = pytest.mark.slow


def test_start_with_no_arguments_comes_up_ready(tmp_path):
    with private_machine(tmp_path / "home") as env:
        _quickstart(env, tmp_path)


def _quickstart(env: dict, tmp_path) -> None:
    nobuilders = tmp_path / "nobuilders.yaml"
    nobuilders.write_text(json.dumps({"version": 1, "models": [{"path": "llama-3.1-8b"}],
                                      "builders": {"enabled": False}}))
    try:
        first = warmd(env, "start", "--config", str(nobuilders))
        assert first.returncode == 1, first.stdout + first.stderr
        assert "local cluster started" in first.stdout and "builders" in first.stderr

        started = warmd(env, "start")  # the same cluster and controller, a new config
        assert started.returncode == 0, started.stdout + started.stderr
        # until READY, a line per node whenever its state or task count changes
        assert "node " in started.stderr and ": READY 1/1 tasks" in started.stderr
        assert "building flashinfer silu_and_mul" in started.stderr  # while nvcc runs
        # a short summary, not the whole status (`warmd start && warmd status` shows it once)
        assert "1 node(s) warm" in started.stdout and "Cluster totals" not in started.stdout

        status = warmd(env, "status", "--json")
        assert status.returncode == 0, status.stderr
        snap = json.loads(status.stdout)
        assert snap["running"] and snap["ready"]
        [node] = snap["nodes"]
        assert node["state"] == "READY" and node["role"] == "builder"
        name = node["name"]  # the machine's stable name
        assert name and name == (tmp_path / "home/.cache/warmd/node-id").read_text().strip()
        assert node["kernels"] == {"total": 1, "local_hits": 0, "remote_hits": 0,
                                   "compiled": 1, "failed": 0}
        assert snap["totals"]["compiled"] == 1 and snap["totals"]["bytes_published"] > 0
        assert snap["totals"]["store_size"]["keys"] > 0
        # The example model is served by SGLang: `import sglang` sets FlashInfer's workspace
        # to $SGLANG_CACHE_DIR (~/.cache/sglang), and the warmup fills what SGLang reads.
        cached = tmp_path / "home" / ".cache" / "sglang" / ".cache" / "flashinfer"
        assert any(cached.rglob("silu_and_mul*.so"))

        text = warmd(env, "status")
        assert text.returncode == 0 and "READY" in text.stdout and "Cluster totals" in text.stdout
        assert name in text.stdout

        stopped = warmd(env, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped local Ray cluster" in stopped.stdout
        assert "stopped embedded Redis" in stopped.stdout
        # the store commands read the daemon's store; with it stopped they start none
        gone = warmd(env, "cache", "stats")
        assert gone.returncode == 1 and "no shared cache is running" in gone.stderr
        server = warmd(env, "cache", "server", "status")
        assert server.returncode == 3 and "not running" in server.stdout

        down = warmd(env, "status")
        assert down.returncode == 1 and down.stderr == ""
        [line, store] = down.stdout.splitlines()  # two lines, not a table of zeros
        assert "warmd is not running" in line
        assert "the embedded shared cache is stopped; its data is kept in" in store

        again = warmd(env, "start", "--json")
        assert again.returncode == 0, again.stderr
        totals = json.loads(again.stdout)["status"]["totals"]
        assert totals["compiled"] == 0 and totals["hit_rate"] == 1.0, totals
        # a restart is the same node everywhere: in status and in the cache's statistics
        [again_node] = json.loads(again.stdout)["status"]["nodes"]
        assert again_node["name"] == name and again_node["node_id"] != node["node_id"]
        # warm from the caches, its progress still says what it holds (not `-`)
        assert (again_node["progress_done"], again_node["progress_total"]) == (1, 1)
        stats = warmd(env, "cache", "stats", "--json")
        assert stats.returncode == 0, stats.stderr
        assert set(json.loads(stats.stdout)["nodes"]) == {name}
    finally:
        final = warmd(env, "stop", timeout=180)
        assert final.returncode == 0, final.stderr
