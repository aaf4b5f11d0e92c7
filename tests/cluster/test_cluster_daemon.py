"""The daemon on a real multi-node Ray cluster (ray.cluster_utils.Cluster on this machine)
with a real Redis server and real FlashInfer sm_90a builds (silu_and_mul) as the work.

This machine has no GPU: worker nodes advertise FAKE GPUs (`num_gpus=1` plus an
`accelerator_type:H200` resource) so that Ray schedules warm workers on them exactly as on
H200 nodes; the work itself is a real nvcc cross-build for sm_90a. Each simulated node gets its
own cache directories through per-node environment variables, so kernels move between nodes
only through Redis. The tests share one cluster, but none depends on another having run:
each starts the daemon if it is not running (the `daemon` fixture) and adds and removes the
nodes it needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.cluster_support import (  # noqa: E402
    cluster_config,
    copy_llama,
    flashinfer_model,
    ray_head_ports,
    until,
)
from warmd.cluster import CONTROLLER_NAME, RAY_NAMESPACE, agent_name  # noqa: E402
from warmd.cluster.ray_api import PEER_DIRECTORY_NAME  # noqa: E402
from warmd.cluster.state import node_records  # noqa: E402
from warmd.stats import CounterFlag, ids  # noqa: E402
from warmd.store import free_port, start_server  # noqa: E402

pytestmark = pytest.mark.slow

NAMESPACE = "daemon-test"
# a node's seconds counters: compile, fetch, install, verify
TIMES = ids(CounterFlag.RUN | CounterFlag.TIME)
FAKE_GPU = {"num_gpus": 1, "resources": {"accelerator_type:H200": 1}}  # no real GPU here


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.models = base / "models"
        self.no_models = base / "no-models"
        self.server = None
        self.cluster = None
        self.nodes: dict[str, object] = {}
        self.prejoin: subprocess.Popen | None = None

    def node_args(self, name: str, gpu: bool = True, models: Path | None = None) -> dict:
        env = {"FLASHINFER_WORKSPACE_BASE": str(self.base / name / "fi"),
               "WARMD_STATE_DIR": str(self.base / name / "state"),
               "WARMD_TEST_MODELS": str(models or self.models)}
        return {"num_cpus": 1, "env_vars": env, **(FAKE_GPU if gpu else {})}

    def env(self, **extra) -> dict:
        return {**os.environ, "RAY_AUTH_MODE": "disabled",
                "WARMD_STATE_DIR": str(self.base / "cli-state"), **extra}

    def cli(self, *args: str, timeout: float = 300, env: dict | None = None):
        return subprocess.run([sys.executable, "-m", "warmd", *args], env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def status(self) -> dict:
        done = self.cli("status", "--address", self.cluster.address, "--json")
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)

    def snapshot(self) -> dict:
        controller = ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
        return ray.get(controller.snapshot.remote(), timeout=30)

    def record(self, node_id: str) -> dict | None:
        return next((n for n in self.snapshot()["nodes"] if n["node_id"] == node_id), None)

    def wait_record(self, node_id: str, check, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        record = None
        while time.monotonic() < deadline:
            record = self.record(node_id)
            if record is not None and check(record):
                return record
            time.sleep(0.5)
        raise AssertionError(f"node {node_id[:8]} never got there; last record: {record}")

    def node_id(self, name: str) -> str:
        return self.nodes[name].node_id

    def controller(self):
        try:
            return ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
        except ValueError:
            return None

    def start(self) -> None:
        done = self.cli("start", "--address", self.cluster.address, "--config",
                        str(self.config), "--timeout", "300")
        assert done.returncode == 0, done.stdout + done.stderr

    def reset(self) -> None:
        """No daemon, an empty shared cache and empty node caches: a fresh cluster."""
        done = self.cli("stop", "--address", self.cluster.address)
        assert done.returncode == 0, done.stderr
        self.server.client().flushall()
        for name in self.nodes:
            for cache in ("fi", "state"):
                shutil.rmtree(self.base / name / cache, ignore_errors=True)

    def add_node(self, name: str, **kwargs) -> str:
        self.nodes[name] = self.cluster.add_node(**self.node_args(name, **kwargs))
        return self.node_id(name)

    def remove_node(self, name: str) -> None:
        node_id = self.node_id(name)
        self.cluster.remove_node(self.nodes.pop(name))
        until(lambda: self.record(node_id) is None, timeout=90)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("daemon")
    w = World(base)
    copy_llama(w.models)
    w.no_models.mkdir()
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    w.server = start_server(base / "redis", password="test-secret-pw")
    w.url = w.server.url
    w.config = base / "warmd.yaml"
    w.config.write_text(cluster_config(w.url, NAMESPACE,
                                       [flashinfer_model("${WARMD_TEST_MODELS}")]))
    w.cluster = Cluster(initialize_head=True,
                        head_node_args={**w.node_args("head", gpu=False), **ray_head_ports()})
    w.nodes["a"] = w.cluster.add_node(**w.node_args("a"))
    w.nodes["b"] = w.cluster.add_node(**w.node_args("b"))
    ray.init(address=w.cluster.address, namespace=RAY_NAMESPACE, log_to_driver=False)
    try:
        yield w
    finally:
        with contextlib.suppress(Exception):
            w.cli("stop", "--address", w.cluster.address, timeout=120)
        if w.prejoin is not None and w.prejoin.poll() is None:
            stop_ray_start(w.prejoin)
        ray.shutdown()
        w.cluster.shutdown()
        w.server.stop()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


@pytest.fixture
def daemon(world):
    """The daemon running with the test config on nodes a and b (started if it is not)."""
    if world.controller() is None:
        world.start()
    return world


def stop_ray_start(proc: subprocess.Popen) -> None:
    """End a `ray start --block` this test started: SIGTERM drains its node."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def warmd_actors() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == RAY_NAMESPACE}


def test_unreachable_ray_address_is_one_line_exit_2(tmp_path):
    port = free_port()  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "warmd", "start", "--address",
                           f"127.0.0.1:{port}", "--no-wait"],
                          env={**os.environ, "RAY_AUTH_MODE": "disabled",
                               "WARMD_STATE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"warmd: error: cannot reach a Ray cluster at 127.0.0.1:{port}: Connection refused"]
    assert not (tmp_path / "daemon.json").exists()


def test_start_warms_every_selected_node(world):
    world.reset()
    done = world.cli("start", "--address", world.cluster.address, "--config", str(world.config),
                     "--json", "--timeout", "300")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["controller"] == "created"
    assert "test-secret-pw" not in done.stdout + done.stderr
    nodes = {n["node_id"]: n for n in result["status"]["nodes"]}
    gpu_nodes = {world.node_id("a"), world.node_id("b")}
    assert set(nodes) == gpu_nodes  # the head has no GPU and builders are off
    for record in nodes.values():
        assert record["state"] == "READY", record
        assert record["name"]  # each simulated machine's stable name (its own state dir)
        assert record["kernels"]["total"] == 1 and record["kernels"]["failed"] == 0
        assert record["gpus"] == 1 and record["gpu_type"] == "H200"
        assert record["progress_done"] == record["progress_total"] == 1
    totals = result["status"]["totals"]
    # single-flight across nodes: one node built silu_and_mul, the other installed it
    assert totals["compiled"] == 1 and totals["remote_hits"] == 1, totals
    assert result["status"]["ready"] is True
    # where each node's warmup went: every seconds counter, the same in status's records
    split = result["seconds"]["nodes"]
    assert set(split) == gpu_nodes
    installer = next(n for n, r in nodes.items() if r["kernels"]["remote_hits"] == 1)
    for node_id, seconds in split.items():
        assert {i: seconds[i] for i in TIMES} == {i: nodes[node_id]["counters"][i]
                                                  for i in TIMES}
        spent = seconds["fetch_seconds"] + seconds["install_seconds"] + seconds["verify_seconds"]
        assert spent <= seconds["warm"], seconds
    # the node that installed the other's kernel read it from the store and wrote it here
    assert split[installer]["bytes_fetched"] > 0
    assert split[installer]["fetch_seconds"] > 0 and split[installer]["install_seconds"] > 0
    assert totals["fetch_seconds"] == pytest.approx(sum(s["fetch_seconds"]
                                                        for s in split.values()), abs=0.01)

    # exactly one agent per selected node, running on that node; the agents' peer directory
    assert warmd_actors() == {CONTROLLER_NAME, PEER_DIRECTORY_NAME} | {
        agent_name(n) for n in gpu_nodes}
    for node_id in gpu_nodes:
        agent = ray.get_actor(agent_name(node_id), namespace=RAY_NAMESPACE)
        assert ray.get(agent.health.remote(), timeout=30)["running_on"] == node_id
    # the warm workers finished and gave their (fake) GPUs back
    until(lambda: ray.available_resources().get("GPU") == 2.0, timeout=30)

    # any process can read the node states from Redis
    records = node_records(world.url, NAMESPACE).get_all()
    assert {r.node_id: r.state for r in records} == dict.fromkeys(gpu_nodes, "READY")

    # each agent serves Prometheus metrics
    metrics_url = nodes[world.node_id("a")]["metrics_url"]
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    name = nodes[world.node_id("a")]["name"]  # the stable name, not Ray's id
    assert f'warmd_node_state{{node="{name}",state="READY"}} 1.0' in text
    assert "warmd_warmup_seconds_count" in text and 'outcome="compiled"' in text
    assert f'warmd_runtime_jit_total{{library="triton",node="{name}"}} 0.0' in text
    assert 'warmd_build_info{component="agent"' in text and "process_cpu_seconds_total" in text

    # the controller serves the cluster's gauges: both nodes READY, the boot done
    url = world.status()["controller"]["metrics_url"]
    cluster = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'warmd_cluster_nodes{state="READY"} 2.0' in cluster
    assert 'warmd_cluster_nodes{state="FAILED"} 0.0' in cluster
    assert "warmd_cluster_warm_ratio 1.0" in cluster
    assert 'warmd_cluster_progress_tasks{kind="done"} 2.0' in cluster
    assert 'warmd_build_info{component="controller"' in cluster

    shown = world.cli("status", "--address", world.cluster.address)
    assert shown.returncode == 0, shown.stderr
    assert world.node_id("a")[:8] in shown.stdout and "READY" in shown.stdout
    assert "Cluster totals" in shown.stdout and "test-secret-pw" not in shown.stdout
    assert nodes[world.node_id("a")]["name"] in shown.stdout
    assert nodes[world.node_id("a")]["name"] != nodes[world.node_id("b")]["name"]

    again = world.cli("start", "--address", world.cluster.address, "--config",
                      str(world.config), "--no-wait", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["controller"] == "updated"  # idempotent: same controller
    assert warmd_actors() == {CONTROLLER_NAME, PEER_DIRECTORY_NAME} | {
        agent_name(n) for n in gpu_nodes}

    summary = world.cli("start", "--address", world.cluster.address, "--config",
                        str(world.config), "--timeout", "120")
    assert summary.returncode == 0, summary.stderr
    # a short summary (the full view is `warmd status`)
    assert "2 node(s) warm" in summary.stdout and "2 READY" in summary.stdout
    assert "Cluster totals" not in summary.stdout and len(summary.stdout.splitlines()) == 3


def test_prejoin_node_joins_warm_and_labelled(daemon):
    world = daemon
    """The KubeRay worker command: warm from the config, then `ray start --labels`."""
    name = "e"
    env = world.env(FLASHINFER_WORKSPACE_BASE=str(world.base / name / "fi"),
                    WARMD_STATE_DIR=str(world.base / name / "state"),
                    WARMD_TEST_MODELS=str(world.models))
    done = world.cli("warmup", "--from-config", str(world.config), "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["state"] == "READY"
    assert report["kernels"] == {"total": 1, "local_hits": 0, "remote_hits": 1,
                                 "compiled": 0, "failed": 0}
    log = world.base / name / "ray-start.log"

    def ray_start() -> subprocess.Popen:
        with log.open("a") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                 f"--address={world.cluster.address}", "--num-cpus=1", "--num-gpus=1",
                 '--resources={"accelerator_type:H200": 1}', "--labels=warmd.io/warm=true",
                 f"--dashboard-agent-listen-port={free_port()}"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    world.prejoin = ray_start()
    restarts = []

    def labelled_node() -> str | None:
        # `ray start` gives up when its node has not registered in Ray's fixed 30 s, which a
        # loaded 2-core machine can miss: started again, as KubeRay restarts the pod
        if world.prejoin.poll() is not None:
            restarts.append(world.prejoin.returncode)
            world.prejoin = ray_start()
        return next((n["NodeID"] for n in ray.nodes() if n["Alive"] and
                     n.get("Labels", {}).get("warmd.io/warm") == "true"), None)

    try:
        node_id = until(labelled_node, timeout=240)
    except AssertionError:
        raise AssertionError(f"no labelled node (ray start exits: {restarts}): "
                             f"{log.read_text()[-3000:]}") from None
    # serving selects warm nodes by label
    where = ray.remote(lambda: ray.get_runtime_context().get_node_id())
    assert ray.get(where.options(label_selector={"warmd.io/warm": "true"}, num_cpus=0)
                   .remote(), timeout=60) == node_id
    # and its agent finds everything already there
    record = world.wait_record(node_id, lambda r: r["state"] == "READY")
    assert record["kernels"]["compiled"] == 0 and record["hit_rate"] == 1.0
    stop_ray_start(world.prejoin)
    until(lambda: world.record(node_id) is None, timeout=90)


def test_node_added_later_is_warmed_without_a_command(daemon):
    world = daemon
    node_id = world.add_node("c")
    done = world.cli("wait-ready", "--address", world.cluster.address, "--node-id",
                     node_id[:12], "--timeout", "180")
    assert done.returncode == 0, done.stdout + done.stderr
    record = world.record(node_id)
    assert record["state"] == "READY"
    assert record["kernels"]["remote_hits"] == 1 and record["kernels"]["compiled"] == 0
    world.remove_node("c")


def test_killed_agent_is_replaced_and_resumes_from_cache(daemon):
    world = daemon
    node_id = world.node_id("a")
    agent = ray.get_actor(agent_name(node_id), namespace=RAY_NAMESPACE)
    old = ray.get(agent.health.remote(), timeout=30)
    killed_at = time.time()
    ray.kill(agent, no_restart=True)
    record = world.wait_record(node_id, lambda r: r["agent"] != old["agent"]
                               and r["state"] == "READY"
                               and (r.get("warmed_at") or 0) > killed_at)
    assert record["kernels"]["compiled"] == 0 and record["hit_rate"] == 1.0
    assert world.snapshot()["controller"]["counters"]["agents_replaced"] >= 1


def test_removed_node_leaves_the_status(daemon):
    world = daemon
    node_id = world.add_node("f")
    world.wait_record(node_id, lambda r: r["state"] == "READY")
    assert agent_name(node_id) in warmd_actors()
    world.cluster.remove_node(world.nodes.pop("f"))
    until(lambda: node_id not in {n["node_id"] for n in world.status()["nodes"]}, timeout=90)
    assert agent_name(node_id) not in warmd_actors()
    assert node_id not in {r.node_id for r in node_records(world.url, NAMESPACE).get_all()}


def test_model_missing_on_one_node_fails_only_that_node(daemon):
    world = daemon
    node_id = world.add_node("d", models=world.no_models)
    record = world.wait_record(node_id, lambda r: r["state"] == "FAILED")
    assert "model config not found" in record["reason"]
    assert str(world.no_models / "llama") in record["reason"]
    states = {n["node_id"]: n["state"] for n in world.status()["nodes"]}
    assert states[world.node_id("a")] == states[world.node_id("b")] == "READY"
    shown = world.cli("status", "--address", world.cluster.address)
    assert shown.returncode == 1
    assert f"{node_id[:8]} FAILED: model llama: model config not found" in shown.stdout
    waited = world.cli("wait-ready", "--address", world.cluster.address, "--node-id", node_id,
                       "--timeout", "60")
    assert waited.returncode == 1 and "FAILED" in waited.stderr
    ok = world.cli("wait-ready", "--address", world.cluster.address, "--node-id",
                   world.node_id("b"), "--timeout", "60")
    assert ok.returncode == 0, ok.stderr
    world.remove_node("d")


def test_unreachable_redis_is_refused_before_it_is_applied(daemon):
    """Validate, then apply: a --redis where nothing listens would leave every node
    DEGRADED; it is refused (one line, exit 2) and the nodes stay as they were."""
    world = daemon
    dead = f"redis://127.0.0.1:{free_port()}/0"
    before = {n["node_id"]: (n["state"], n["warmed_at"]) for n in world.snapshot()["nodes"]}
    config_hash = world.status()["controller"]["config_hash"]
    refused = world.cli("start", "--address", world.cluster.address, "--config",
                        str(world.config), "--redis", dead, "--timeout", "180")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "does not answer" in refused.stderr
    assert world.status()["controller"]["config_hash"] == config_hash  # never applied
    after = {n["node_id"]: (n["state"], n["warmed_at"]) for n in world.snapshot()["nodes"]}
    assert after == before

    back = world.cli("start", "--address", world.cluster.address, "--config",
                     str(world.config), "--json", "--timeout", "180")
    assert back.returncode == 0, back.stderr
    assert {n["state"] for n in json.loads(back.stdout)["status"]["nodes"]} == {"READY"}


def test_stop_then_start_finds_the_cache_warm(daemon):
    world = daemon
    done = world.cli("stop", "--address", world.cluster.address, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["controller"] is True
    assert warmd_actors() == set()
    assert node_records(world.url, NAMESPACE).get_all() == []
    assert world.server.client().dbsize() > 0  # the shared cache is intact
    down = world.cli("status", "--address", world.cluster.address)
    assert down.returncode == 1 and "not running" in down.stdout

    again = world.cli("start", "--address", world.cluster.address, "--config",
                      str(world.config), "--json", "--timeout", "180")
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    totals = result["status"]["totals"]
    assert totals["compiled"] == 0 and totals["hit_rate"] == 1.0, totals
    # warm from disk: the store's task records read, no entry installed, the entries on disk
    # verified against this node's records
    for seconds in result["seconds"]["nodes"].values():
        assert seconds["bytes_fetched"] == 0 and seconds["install_seconds"] == 0.0, seconds
        assert 0 < seconds["verify_seconds"] <= seconds["warm"], seconds
        assert seconds["fetch_seconds"] + seconds["verify_seconds"] <= seconds["warm"], seconds
