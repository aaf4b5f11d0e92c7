"""`warmd warmup` (the real CLI, a real FlashInfer sm_90a build, a real redis-server) against
a claim a keyless writer keeps alive on the module's task: the warmup waits for it no
longer than --single-flight-timeout, then builds the module itself and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS, flashinfer_plan
from store_support import SRC, start_test_server

from warmd.libraries import LIBRARIES
from warmd.store import layout, open_shared_cache

pytestmark = pytest.mark.slow

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]


def _task_lease(url: str, workspace) -> str:
    plan = flashinfer_plan()
    (task,) = [t for t in plan.tasks if "act_and_mul" in t.key]
    cache = open_shared_cache(url, target=plan.env.target, node="planter")
    try:
        adapter = LIBRARIES["flashinfer"].make_adapter(workspace, plan.env.target.arch)
        return layout.lease_key(cache.fingerprint(adapter).digest, task.key)
    finally:
        cache.close()


def test_a_planted_claim_holds_the_cli_no_longer_than_the_single_flight_timeout(tmp_path):
    server = start_test_server(tmp_path)
    stop = threading.Event()
    try:
        workspace = tmp_path / "ws"
        lease = _task_lease(server.url, workspace)
        client = server.client()
        record = f"c1|mallory|4242|{int(time.time() * 1000)}|0123456789ab"

        def keep_alive():  # as a live holder would: a short TTL, renewed
            while not stop.is_set():
                client.set(lease, record, px=3000)
                stop.wait(0.5)

        planter = threading.Thread(target=keep_alive, daemon=True)
        planter.start()
        env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"),
               "FLASHINFER_WORKSPACE_BASE": str(workspace), "WARMD_NODE_NAME": "victim",
               "PYTHONPATH": SRC}
        began = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", "from warmd.cli import main; main()", "warmup", *PLAN_ARGS,
             "--redis", server.url, "--single-flight-timeout", "5", "--json"],
            capture_output=True, text=True, env=env, cwd=SRC, timeout=900)
        seconds = time.monotonic() - began
    finally:
        stop.set()
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["kernels"]["compiled"] == 1 and report["tasks_failed"] == 0
    assert seconds >= 5  # the claim was honoured for the timeout, then no longer
    assert "waited 5 s" in proc.stderr and "building it here" in proc.stderr
