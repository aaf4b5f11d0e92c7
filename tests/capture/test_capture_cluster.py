"""Issue 11's must-hold, on a real 3-node Ray cluster (ray.cluster_utils.Cluster) with a real
redis-server: node A is READY; a process on A compiles a Triton kernel (real sm_90) and a
FlashInfer module no plan names (real nvcc build); within seconds `warmd status` shows
runtime JIT = 2 on A; A, the cluster's trusted producer (capture.trust `rederive`, the
default, with A in rederive_nodes), re-derives both from what it captured and publishes what
it built; a node added afterwards installs both before READY, and the same compiles there
create no new entries (runtime JIT = 0 there).

Worker nodes advertise fake GPUs (no GPU here), as in tests/cluster/test_cluster_daemon.py; each
node has its own caches through per-node environment variables, so entries move between
nodes only through Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("triton")
pytest.importorskip("flashinfer")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from tests.cluster_support import (  # noqa: E402
    cluster_config,
    copy_llama,
    flashinfer_model,
    ray_head_ports,
    until,
)
from tests.triton_support import snapshot  # noqa: E402
from warmd.cluster import RAY_NAMESPACE  # noqa: E402
from warmd.store import start_server  # noqa: E402

pytestmark = pytest.mark.slow
REPO = str(Path(__file__).resolve().parents[2])


def node_env(base: Path, name: str) -> dict:
    return {"FLASHINFER_WORKSPACE_BASE": str(base / name / "fi"),
            "TRITON_CACHE_DIR": str(base / name / "triton"),
            "VLLM_CACHE_ROOT": str(base / name / "vllm"),
            "WARMD_STATE_DIR": str(base / name / "state"), "WARMD_NODE_NAME": f"node-{name}",
            "PYTHONPATH": REPO}


def add_node(cluster, base: Path, name: str, gpu: bool = True):
    extra = {"num_gpus": 1, "resources": {"accelerator_type:H200": 1}} if gpu else {}
    return cluster.add_node(num_cpus=1, env_vars=node_env(base, name), **extra)


@ray.remote(num_cpus=0)
def run_engine() -> dict:
    """The engine on this node: its compiles in a process of their own."""
    done = subprocess.run([sys.executable, "-m", "tests.capture_engine"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def on(node_id: str):
    return run_engine.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id, soft=False))


def cli(base: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": REPO,
           "WARMD_STATE_DIR": str(base / "cli-state")}
    return subprocess.run([sys.executable, "-m", "warmd", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def status(base: Path, address: str, *flags: str) -> tuple[int, dict]:
    done = cli(base, "status", "--address", address, "--json", *flags)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def node(snap: dict, node_id: str) -> dict:
    return next(n for n in snap["nodes"] if n["node_id"] == node_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("capture")
    copy_llama(base / "models")
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    server = start_server(base / "redis")
    config = base / "warmd.yaml"
    data = json.loads(cluster_config(server.url, "capture-test",
                                     [flashinfer_model(str(base / "models"))]))
    # the default trust (re-derivation), node A the trusted producer, which looks Triton
    # kernels up in the library stand-in's module (tests/triton_kernels.py)
    data["capture"] = {"trust": "rederive", "rederive_nodes": ["node-a"],
                       "triton_modules": ["tests.triton_kernels"]}
    config.write_text(json.dumps(data))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **ray_head_ports(),
                                                      "env_vars": node_env(base, "head")})
    ray.init(address=c.address, namespace=RAY_NAMESPACE, log_to_driver=False)
    try:
        yield base, c, config, server
    finally:
        cli(base, "stop", "--address", c.address, timeout=120)
        ray.shutdown()
        c.shutdown()
        server.stop()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def test_runtime_jit_is_counted_shared_and_never_compiled_again(cluster):
    base, c, config, server = cluster
    a = add_node(c, base, "a").node_id
    started = cli(base, "start", "--address", c.address, "--config", str(config),
                  "--timeout", "300")
    assert started.returncode == 0, started.stdout + started.stderr
    code, snap = status(base, c.address, "--fail-on-runtime-jit")
    assert code == 0 and node(snap, a)["state"] == "READY"
    assert node(snap, a)["runtime_jit"] == {} and snap["totals"]["runtime_jit"] == 0

    compiled = ray.get(on(a).remote(), timeout=600)  # the engine compiles in traffic
    finished = time.monotonic()
    snap = until(lambda: (s := status(base, c.address)[1]) and
                    sum(node(s, a)["runtime_jit"].values()) >= 2 and s, timeout=30, interval=0.25)
    seen_after = time.monotonic() - finished
    record = node(snap, a)
    assert record["runtime_jit"] == {"triton": 1, "flashinfer": 1}, record
    assert {(e["library"], e["node"]) for e in record["runtime_jit_events"]} == {
        ("triton", record["name"]), ("flashinfer", record["name"])}
    assert snap["totals"]["runtime_jit"] == 2
    assert {e["library"] for e in snap["runtime_jit"]} == {"triton", "flashinfer"}
    shown = cli(base, "status", "--address", c.address)
    assert "runtime JIT: 2 (last: " in shown.stdout
    failing = cli(base, "status", "--address", c.address, "--fail-on-runtime-jit")
    assert failing.returncode == 1 and "2 kernel(s) compiled after READY" in failing.stderr
    jit = f'warmd_runtime_jit_total{{library="triton",node="{record["name"]}"}}'
    metrics = until(lambda: (t := _metrics(record["metrics_url"])) and
                    f"{jit} 1.0" in t and t, timeout=10)  # (its series is there from 0)
    assert f"{jit} 1.0" in metrics
    print(f"engine compiles {compiled}; runtime JIT = 2 in status {seen_after:.2f}s after "
          "they finished")

    until(lambda: sum(node(status(base, c.address)[1], a)["capture"].get(
        "captured", {}).values()) >= 2, timeout=30, interval=0.25)
    captured = time.monotonic()
    rederived = until(lambda: (n := node(status(base, c.address)[1], a)["capture"]) and
                      sum(n.get("rederived", {}).values()) >= 2 and n, timeout=240, interval=1)
    assert rederived["rederived"] == {"triton": 1, "flashinfer": 1}, rederived
    print(f"re-derived on A and published {time.monotonic() - captured:.1f}s after capture")
    later = add_node(c, base, "c").node_id
    done = cli(base, "wait-ready", "--address", c.address, "--node-id", later[:12],
               "--timeout", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    snap = status(base, c.address)[1]
    assert node(snap, later)["capture"]["learned"] == 2  # installed before READY
    caches = [base / "c" / "triton", base / "c" / "fi" / ".cache" / "flashinfer"]
    before = [snapshot(p) for p in caches]
    again = ray.get(on(later).remote(), timeout=600)
    # FlashInfer's own log (flashinfer_jit.log) records every load; anything else written
    # would be a compile
    changed = [sorted(k for k, v in snapshot(p).items() if before[i].get(k) != v
                      and not k.endswith("flashinfer_jit.log")) for i, p in enumerate(caches)]
    assert changed == [[], []], again  # no compile wrote anything
    time.sleep(3)  # the watcher would have seen a new entry by now
    code, snap = status(base, c.address)
    assert node(snap, later)["runtime_jit"] == {}
    assert node(snap, a)["runtime_jit"] == {"triton": 1, "flashinfer": 1}
    print(f"on the node added later the same compiles took {again} and wrote nothing")


def _metrics(url: str) -> str:
    import urllib.request

    return urllib.request.urlopen(url, timeout=10).read().decode()
