"""Support for the tests and benchmarks that run the daemon on a Ray cluster: the one builder
of their warmd.yaml (`cluster_config`; scripts/bench/bench_join.py uses it too), and a private
machine for tests that run `warmd start` without --address: its own HOME (state dir, caches),
its own Ray temp dir (RAY_TMPDIR, so a cluster that a user's `ray start` or warmd daemon runs
on this machine is never found) and no warmd/Ray variables of the caller."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FAST_AGENT = {"reconcile_seconds": 1, "heartbeat_seconds": 1, "metrics_port": 0}


# Ray waits a fixed 30 s for a starting node to register, and a cluster start takes both cores
# for seconds: more than two clusters starting at once on a 2-core machine can miss that
# bound. The modules that start Ray clusters one test after another share two pytest-xdist
# groups (tests/conftest.py's scheduler), so that at most two of them run at once.
RAY_CLUSTER_GROUPS = {
    "tests/cluster/test_cluster_daemon.py": "ray-clusters-1",
    "tests/cluster/test_cluster_fanout.py": "ray-clusters-1",
    "tests/cluster/test_daemon_changes.py": "ray-clusters-1",
    "tests/cluster/test_daemon_loopback.py": "ray-clusters-1",
    "tests/cluster/test_local_head_ports.py": "ray-clusters-1",
    "tests/capture/test_capture_cluster.py": "ray-clusters-2",
    "tests/cluster/test_cluster_local.py": "ray-clusters-2",
    "tests/cluster/test_cluster_quickstart.py": "ray-clusters-2",
}


def ray_head_ports() -> dict:
    """A test's Ray head's arguments for the ports Ray would otherwise take at fixed defaults
    (the dashboard's 8265 and its agent's 52365): free-picked, so that Ray clusters of tests
    running in parallel processes (pytest-xdist) never meet. Every other port Ray picks."""
    from warmd.store import free_port

    return {"dashboard_port": free_port(), "dashboard_agent_listen_port": free_port()}


def flashinfer_model(models: str, name: str = "llama") -> dict:
    """The model the cluster tests warm: FlashInfer's silu_and_mul, cross-built for sm_90a
    (no GPU needed). `models` may hold $VARS: they expand on each node."""
    return {"name": name, "path": f"{models}/{name}", "engine": "sglang", "target": "h200",
            "with": ["flashinfer"], "libraries": ["flashinfer"],
            "task_filter": "silu_and_mul"}


def copy_llama(models: Path, name: str = "llama") -> Path:
    """models/<name>/config.json: the bundled Llama 3.1 8B config, where flashinfer_model
    looks for it."""
    from warmd.examples import EXAMPLES_DIR

    (models / name).mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES_DIR / "llama-3.1-8b" / "config.json", models / name)
    return models / name


def cluster_config(url: str, namespace: str, models: list[dict],
                   agent: dict | None = None) -> str:
    """warmd.yaml (as JSON, which YAML reads) for a cluster whose GPU nodes are H200s,
    builders off, the shared cache at `url`."""
    return json.dumps({"version": 1, "models": models,
                       "redis": {"url": url, "namespace": namespace},
                       "nodes": {"gpu_types": ["H200"]}, "builders": {"enabled": False},
                       "agent": FAST_AGENT if agent is None else agent}, indent=2) + "\n"


@contextmanager
def private_machine(home: Path) -> Iterator[dict]:
    # Ray puts unix sockets under RAY_TMPDIR: the path must stay short.
    ray_tmp = tempfile.mkdtemp(prefix="wr-", dir="/tmp")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WARMD_", "RAY_", "FLASHINFER_", "DG_JIT_", "VLLM_", "XDG_"))}
    try:
        yield {**env, "HOME": str(home), "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp}
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def warmd(env: dict, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def warmd_popen(env: dict, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warmd", *args], env=env, text=True,
                            **kwargs)


def until(check, timeout: float = 120, interval: float = 0.5):
    """check()'s first true value, polling; AssertionError when none comes in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")
