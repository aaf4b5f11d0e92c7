"""`warmd start` on a multi-node ray.cluster_utils.Cluster whose nodes join at once (the
`ray` mode of scripts/bench/bench_cluster_boot.py): K GPU nodes (each a raylet of this machine
with a fake H200 resource and its own caches) added before `warmd start`, a real
redis-server, small FlashInfer modules cross-built for sm_90a (no GPU needed). From
`warmd start --json`: every node's kernels compiled here / installed from peers / waited
for, and the compiles summed against the distinct modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GPU_NODE = {"num_gpus": 1, "resources": {"accelerator_type:H200": 1}}
FILTER = "silu_and_mul"  # the plan's one small module (warmd.yaml sets no attention backend)


def ray_run(k: int, opts) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from tests.cluster_support import cluster_config, copy_llama, flashinfer_model
    from warmd.store import start_server

    base = Path(tempfile.mkdtemp(prefix="wb-", dir="/tmp"))
    models = base / "models"
    copy_llama(models)
    server = start_server(base / "redis", appendonly=False)
    model = {**flashinfer_model("${WARMD_BENCH_MODELS}"), "task_filter": FILTER}
    config = base / "warmd.yaml"
    config.write_text(cluster_config(server.url, "boot-bench", [model],
                                     agent={"metrics_port": 0, "reconcile_seconds": 1,
                                            "heartbeat_seconds": 1}))

    def node_args(name: str, gpu: bool = True) -> dict:
        env = {"FLASHINFER_WORKSPACE_BASE": str(base / name / "fi"),
               "WARMD_STATE_DIR": str(base / name / "state"),
               "WARMD_BENCH_MODELS": str(models), "WARMD_NODE_NAME": name}
        return {"num_cpus": 1, "env_vars": env, **(GPU_NODE if gpu else {"num_gpus": 0})}

    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(initialize_head=True, head_node_args=node_args("head", gpu=False))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WARMD_STATE_DIR": str(base / "cli")}
    try:
        for i in range(k):  # the nodes join at once: all there before warmd starts
            cluster.add_node(**node_args(f"n{i}"))
        cluster.wait_for_nodes()
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "warmd", "start", "--config", str(config),
                               "--address", cluster.address, "--json", "--timeout",
                               str(opts.timeout)], env=env, capture_output=True, text=True,
                              timeout=opts.timeout + 60)
        wall = round(time.monotonic() - began, 3)
        if done.returncode != 0:
            raise SystemExit(f"warmd start failed ({done.returncode}): "
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        data = json.loads(done.stdout)
    finally:
        subprocess.run([sys.executable, "-m", "warmd", "stop", "--address", cluster.address],
                       env=env, capture_output=True, text=True, timeout=120)
        ray.shutdown()
        cluster.shutdown()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    status = data["status"]
    nodes = [n for n in status["nodes"] if n.get("role") != "builder"]
    rows = [{"node": n.get("name"), "state": n.get("state"),
             "compiled": (n.get("kernels") or {}).get("compiled", 0),
             "installed": (n.get("boot") or {}).get("installed", 0),
             "remote_hits": (n.get("kernels") or {}).get("remote_hits", 0),
             "waited": (n.get("boot") or {}).get("waited", 0),
             "took_over": (n.get("boot") or {}).get("took_over", 0),
             "wall": n.get("warm_seconds"), "timeline": (n.get("boot") or {}).get("timeline")}
            for n in nodes]
    kernels = {r["compiled"] + r["remote_hits"] for r in rows}
    return {"k": k, "wall": wall, "distinct_kernels": max(kernels) if kernels else 0,
            "summed_compiles": sum(r["compiled"] for r in rows),
            "compile_log": None, "compile_log_distinct": None,
            "all_ready": all(n.get("state") == "READY" for n in nodes) and len(nodes) == k,
            "boot": status.get("boot"), "seconds": data.get("seconds"), "nodes": rows}
