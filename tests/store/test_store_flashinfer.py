"""`warmd warmup` processes sharing real FlashInfer sm_90a builds through a real redis-server:
the second node compiles nothing, and concurrent cold nodes build the module once in total."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS
from store_support import SRC, start_test_server

from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
from warmd.store import admin, open_shared_cache

pytestmark = pytest.mark.slow

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]
MODULE = "silu_and_mul"


@pytest.fixture
def server(tmp_path):
    srv = start_test_server(tmp_path, password="fi-pw")
    yield srv
    srv.stop()


def _warmup(server, tmp_path, node: str) -> subprocess.Popen:
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / node / "state"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / node / "ws"), "WARMD_NODE_NAME": node,
           "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-c", "from warmd.cli import main; main()",
                             "warmup", *PLAN_ARGS, "--redis", server.url, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=SRC)


def _report(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_second_warmup_installs_everything_and_compiles_nothing(server, tmp_path):
    first = _report(_warmup(server, tmp_path, "node-a"))
    assert first["kernels"]["compiled"] == 1 and first["tasks_failed"] == 0
    second = _report(_warmup(server, tmp_path, "node-b"))
    assert second["kernels"] == {"total": 1, "local_hits": 0, "remote_hits": 1,
                                 "compiled": 0, "failed": 0}
    assert second["hit_rate"] == 1.0
    adapter = FlashInferCacheAdapter(tmp_path / "node-b" / "ws", "9.0a")
    assert adapter.is_up_to_date(MODULE)[0]  # FlashInfer's own ninja finds nothing to do
    # The same node again: what it already has is a local hit, not a remote one.
    again = _report(_warmup(server, tmp_path, "node-b"))
    assert again["kernels"] == {"total": 1, "local_hits": 1, "remote_hits": 0,
                                "compiled": 0, "failed": 0}


def test_concurrent_cold_warmups_build_once(server, tmp_path):
    procs = [_warmup(server, tmp_path, f"node-{i}") for i in range(3)]
    reports = [_report(p) for p in procs]
    assert sum(r["kernels"]["compiled"] for r in reports) == 1
    assert sum(r["kernels"]["remote_hits"] for r in reports) == 2
    cache = open_shared_cache(server.url)
    nodes = admin.read_stats(cache)["nodes"]
    cache.close()
    assert sorted(n.get("published", 0) for n in nodes.values()) == [0, 0, 1]
    assert sorted(n.get("remote_hits", 0) for n in nodes.values()) == [0, 1, 1]
