"""The README's first command on a fresh machine: `warmd start` with no arguments starts a
local Ray cluster and the embedded Redis, warms the embedded default config (one small
FlashInfer module, built for sm_90a on this CPU-only machine) and `warmd status` shows the
node READY with its counters. `warmd stop` ends exactly what `start` started; a second
`start` finds everything in the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from warmd.cluster.client import _local_candidates, reachable  # noqa: E402

pytestmark = pytest.mark.slow


def fresh_env(home) -> dict:
    """A machine where warmd never ran: its own HOME (caches, state) and no warmd/Ray vars."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WARMD_", "RAY_", "FLASHINFER_", "DG_JIT_", "VLLM_", "XDG_"))}
    return {**env, "HOME": str(home), "RAY_AUTH_MODE": "disabled"}


def warmd(env: dict, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_start_with_no_arguments_comes_up_ready(tmp_path):
    running = [a for a in _local_candidates() if reachable(a, timeout=1.0) is None]
    if running:
        pytest.skip(f"a Ray cluster already runs on this machine ({running[0]}): not fresh")
    env = fresh_env(tmp_path / "home")
    try:
        started = warmd(env, "start")
        assert started.returncode == 0, started.stdout + started.stderr
        assert "local cluster started" in started.stdout

        status = warmd(env, "status", "--json")
        assert status.returncode == 0, status.stderr
        snap = json.loads(status.stdout)
        assert snap["running"] and snap["ready"]
        [node] = snap["nodes"]
        assert node["state"] == "READY" and node["role"] == "builder"
        assert node["kernels"] == {"total": 1, "local_hits": 0, "remote_hits": 0,
                                   "compiled": 1, "failed": 0}
        assert snap["totals"]["compiled"] == 1 and snap["totals"]["bytes_published"] > 0
        assert snap["totals"]["store_size"]["keys"] > 0
        cached = tmp_path / "home" / ".cache" / "flashinfer"
        assert any(cached.rglob("silu_and_mul*.so"))

        text = warmd(env, "status")
        assert text.returncode == 0 and "READY" in text.stdout and "Cluster totals" in text.stdout

        stopped = warmd(env, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped local Ray cluster" in stopped.stdout
        assert "stopped embedded Redis" in stopped.stdout

        again = warmd(env, "start", "--json")
        assert again.returncode == 0, again.stderr
        totals = json.loads(again.stdout)["status"]["totals"]
        assert totals["compiled"] == 0 and totals["hit_rate"] == 1.0, totals
    finally:
        final = warmd(env, "stop", timeout=180)
        assert final.returncode == 0, final.stderr
