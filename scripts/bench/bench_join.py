"""A node joining a warm cluster, and `warmd start` on a warm store (issue 12), on one
machine: a real multi-node Ray cluster (ray.cluster_utils.Cluster: every node a raylet of
its own here, each with its own caches), a real redis-server, the daemon warming one task.

    PYTHONPATH=$PWD python scripts/bench/bench_join.py [--joins 3] [--json] [--library deep_gemm]

--library flashinfer (default): FlashInfer's silu_and_mul, cross-built for sm_90a, on nodes
that carry a fake GPU resource (no GPU needed). --library deep_gemm: one DeepGEMM task of
Qwen3-30B-A3B-FP8 (fp8_gemm_nt 2048x4096, M 1 and 64), compiled on a node's real GPU: every
node is a raylet of this machine with `num_gpus=1`, so all of them share its one GPU.

1. `warmd start --json` on a cold cluster (node a compiles and publishes), then `warmd
   stop` and `warmd start --json` again (caches kept): each with its time split.
2. `--joins` times: a node with empty caches joins; measured from the moment `add_node`
   returns: when its agent answers (its actor started), and when its record says READY
   (installed from the store, nothing compiled). Goal: READY within 3 s of its agent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from tests.cluster_support import cluster_config, copy_llama, flashinfer_model
from warmd.cluster import CONTROLLER_NAME, RAY_NAMESPACE, agent_name
from warmd.store import start_server

GPU_NODE = {"num_gpus": 1, "resources": {"accelerator_type:H200": 1}}
NAMESPACE = "join-bench"
# DeepGEMM on the node's GPU: one task of a bundled example, two M values.
DEEP_GEMM_MODEL = {"name": "qwen", "path": "qwen3-30b-a3b-fp8", "engine": "vllm",
                   "target": "h200", "libraries": ["deep_gemm"], "with": ["deep_gemm"],
                   "m_list": "1,64", "task_filter": "^deep_gemm/fp8_gemm_nt/2048x4096/"}


class Bench:
    def __init__(self, base: Path, library: str) -> None:
        self.base = base
        self.models = base / "models"
        copy_llama(self.models)
        self.server = start_server(base / "redis", appendonly=False)
        self.config = base / "warmd.yaml"
        model = DEEP_GEMM_MODEL if library == "deep_gemm" else flashinfer_model(
            "${WARMD_BENCH_MODELS}")
        # the agent's default timings: what a deployment gets
        self.config.write_text(cluster_config(self.server.url, NAMESPACE, [model],
                                              agent={"metrics_port": 0}))
        self.cluster = Cluster(initialize_head=True,
                               head_node_args=self.node_args("head", gpu=False))
        self.nodes = {"a": self.cluster.add_node(**self.node_args("a"))}
        ray.init(address=self.cluster.address, namespace=RAY_NAMESPACE, log_to_driver=False)

    def node_args(self, name: str, gpu: bool = True) -> dict:
        env = {"FLASHINFER_WORKSPACE_BASE": str(self.base / name / "fi"),
               "DG_JIT_CACHE_DIR": str(self.base / name / "dg"),
               "WARMD_STATE_DIR": str(self.base / name / "state"),
               "WARMD_BENCH_MODELS": str(self.models)}
        # num_gpus=0 on the head: on a GPU machine Ray would otherwise give it the GPU
        return {"num_cpus": 1, "env_vars": env, **(GPU_NODE if gpu else {"num_gpus": 0})}

    def cli(self, *args: str) -> tuple[subprocess.CompletedProcess, float]:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled",
               "WARMD_STATE_DIR": str(self.base / "cli-state")}
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "warmd", *args, "--address",
                               self.cluster.address], env=env, capture_output=True, text=True,
                              timeout=600)
        return done, round(time.monotonic() - began, 3)

    def start(self) -> dict:
        done, wall = self.cli("start", "--config", str(self.config), "--json")
        if done.returncode != 0:
            raise SystemExit(f"warmd start failed: {done.stdout}{done.stderr}")
        data = json.loads(done.stdout)
        return {"wall_s": wall, "seconds": data.get("seconds"),
                "kernels": data["status"]["totals"].get("kernels")
                if "totals" in data.get("status", {}) else None}

    def join(self, name: str) -> dict:
        """Add a node with empty caches; when its agent answers, when it is READY."""
        added = time.monotonic()
        self.nodes[name] = self.cluster.add_node(**self.node_args(name))
        joined = time.monotonic()
        node_id = self.nodes[name].node_id
        agent_up = ready = None
        record: dict = {}
        while time.monotonic() - joined < 120:
            try:
                agent = ray.get_actor(agent_name(node_id), namespace=RAY_NAMESPACE)
                record = ray.get(agent.health.remote(), timeout=5)
            except Exception:  # not there yet
                time.sleep(0.02)
                continue
            agent_up = agent_up or time.monotonic()
            if record.get("state") == "READY":
                ready = time.monotonic()
                break
            time.sleep(0.02)
        kernels = record.get("kernels") or {}
        return {"node": name, "add_node_s": round(joined - added, 3),
                "agent_up_after_join_s": _since(agent_up, joined),
                "ready_after_join_s": _since(ready, joined),
                "ready_after_agent_s": _since(ready, agent_up),
                "state": record.get("state"), "kernels": kernels,
                "warm_seconds": record.get("warm_seconds")}

    def close(self) -> None:
        self.cli("stop")
        ray.shutdown()
        self.cluster.shutdown()
        self.server.stop()


def _said(step: str, result: dict) -> dict:
    """A step's result on stderr as it comes (the whole JSON is printed at the end)."""
    print(json.dumps({step: result}), file=sys.stderr, flush=True)
    return result


def _since(t: float | None, origin: float | None) -> float | None:
    return None if t is None or origin is None else round(t - origin, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--library", choices=("flashinfer", "deep_gemm"), default="flashinfer")
    args = parser.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    base = Path(tempfile.mkdtemp(prefix="wj-", dir="/tmp"))
    bench = Bench(base, args.library)
    results: dict = {}
    try:
        results["start_cold"] = _said("start_cold", bench.start())
        bench.cli("stop")
        results["start_warm"] = _said("start_warm", bench.start())
        results["joins"] = [_said("join", bench.join(f"j{i}")) for i in range(args.joins)]
        controller = ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
        results["controller_counters"] = ray.get(controller.snapshot.remote(),
                                                 timeout=30)["controller"]["counters"]
    finally:
        bench.close()
        shutil.rmtree(base, ignore_errors=True)
    joins = results.get("joins", [])
    built = results.get("start_cold", {}).get("kernels")
    results["ok"] = bool(joins and built) and all(
        j["state"] == "READY" and j["ready_after_agent_s"] is not None
        and j["ready_after_agent_s"] <= 3.0 and j["kernels"].get("compiled") == 0
        and j["kernels"].get("remote_hits") == built for j in joins)
    print(json.dumps(results, indent=None if args.json else 1))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
