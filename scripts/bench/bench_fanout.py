#!/usr/bin/env python3
"""Fleet joins against one real redis-server, and fan-out between Ray nodes (issue 22).

    PYTHONPATH=$PWD python scripts/bench/bench_fanout.py redis [--nodes 1,32,128] [--runs 3] \
        [--json]
    PYTHONPATH=$PWD RAY_AUTH_MODE=disabled python scripts/bench/bench_fanout.py ray [--joiners 16]

A plan of `--entries` (60) entries of `--size` (120 KB, incompressible like a cubin) in tasks
of 6, published once, is then joined by N nodes at once. Each node is what an agent's join
is: `open_shared_cache` + `run_warmup` of the plan into its own cache root, with the default
WARMD_REDIS_TIMEOUT and join budget (the test library `tests/testlib` stands in for a JIT
library: it needs no GPU; a task that misses would compile in a worker process and count).

`redis`: N nodes as threads spread over a few processes (this machine has 2 cores), all
released at once; per run: how many nodes compiled anything, Redis `used_memory` sampled
every 20 ms (peak, against the dataset), commands and writes per join from
`INFO commandstats` (every command Redis ran, script bodies included; a write is a command
Redis flags `write`), bytes Redis sent per join, and the slowest join.

`ray`: a `ray.cluster_utils.Cluster` of small nodes (num_cpus=1, a small object store), a
first node warm from the store, then `--joiners` nodes joining at once, each through an
actor pinned to its node running the same join with peers (warmd.cluster.fanout): bytes
Redis served per joining node, every node's installed bytes against the published ones, and
a node given a peer serving flipped bytes (refused, counted; the node still warm).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from warmd.store import open_shared_cache, start_server  # noqa: E402

TASK_SIZE = 6


# --- the plan ---------------------------------------------------------------------------

def plan_of(entries: int) -> dict[str, list[str]]:
    return {f"testlib/bench/{t:03d}": [f"kernel.b{t}_{i}.{t:04x}{i:04x}"
                                       for i in range(min(TASK_SIZE, entries - t * TASK_SIZE))]
            for t in range(-(-entries // TASK_SIZE))}


def publish(url: str, base: Path, plan: dict[str, list[str]], size: int) -> dict[str, bytes]:
    """Compile (testlib's compiler) and publish every entry; returns name -> packed bytes."""
    from testlib.cache import DirAdapter, compile_entry

    adapter = DirAdapter(base / "publisher")
    packed = {}
    with open_shared_cache(url, node="publisher") as cache:
        for task, names in plan.items():
            entries = [compile_entry(adapter, n, size) for n in names]
            packed.update({e.name: adapter.pack(e) for e in entries})
            cache.entries.publish_task(adapter, task, entries, 1.0)
    return packed


def join(url: str, root: Path, node: str, plan: dict[str, list[str]], size: int,
         peers=None) -> dict:
    """One node's join: open the shared cache, run the plan's warmup into root."""
    import dataclasses

    from store_support import warmup_plan
    from testlib import NAME

    from warmd.warmup import WarmupOptions, run_warmup

    began = time.monotonic()
    options = WarmupOptions(workers=1, gpu_ids=(), cache_roots={NAME: root})
    extra = {"peers": peers} if peers is not None else {}  # (runs at older commits too)
    with open_shared_cache(url, node=node, **extra) as cache:
        report = run_warmup(dataclasses.replace(warmup_plan(plan, size=size)), options,
                            shared=cache)
        counters = dict(cache.stats.counters)
    kernels = report.counters.kernel_counts()
    return {"node": node, "seconds": round(time.monotonic() - began, 3),
            "compiled": kernels["compiled"], "remote_hits": kernels["remote_hits"],
            "failed": len(report.failed), "counters": counters}


def register_testlib() -> None:
    from testlib import LIBRARY_MODULE

    from warmd import libraries

    os.environ["WARMD_LIBRARY_PACKAGES"] = LIBRARY_MODULE
    libraries.register(LIBRARY_MODULE)


# --- redis: N nodes at once ------------------------------------------------------------

def _node_process(url: str, base: str, names: list[str], plan: dict, size: int,
                  start_at: float, out) -> None:
    register_testlib()
    results: list[dict] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        try:
            got = join(url, Path(base) / name, name, plan, size)
        except Exception as exc:  # reported, never hidden
            got = {"node": name, "error": f"{type(exc).__name__}: {exc}", "compiled": -1}
        with lock:
            results.append(got)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    time.sleep(max(0.0, start_at - time.time()))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(results)


class Sampler(threading.Thread):
    """Redis used_memory every `every` seconds while the joins run: the peak."""

    def __init__(self, client, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.client, self.every = client, every
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):  # its own timeout under load: again
                self.peak = max(self.peak, int(self.client.info("memory")["used_memory"]))
            self.stop.wait(self.every)


def command_counts(client) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}


def write_commands(client, names) -> set[str]:
    """The commands among names that Redis flags `write` (COMMAND INFO)."""
    writes = set()
    for name in names:
        base = name.split("|")[0]
        info = client.execute_command("COMMAND", "INFO", base).get(base) or {}
        if "write" in [f.decode() if isinstance(f, bytes) else f for f in info.get("flags", [])]:
            writes.add(name)
    return writes


def _cpu(client) -> float:
    """Seconds of CPU the server used so far (its main thread's and the others')."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_run(url: str, client, base: Path, plan: dict, size: int, n: int,
              processes: int) -> dict:
    client.config_resetstat()
    before_cpu = _cpu(client)
    before_out = int(client.info("stats")["total_net_output_bytes"])
    before_mem = int(client.info("memory")["used_memory"])
    sampler = Sampler(client)
    names = [f"n{n}-{i:04d}" for i in range(n)]
    groups = [names[i::processes] for i in range(min(processes, n))]
    queue: mp.Queue = mp.get_context("spawn").Queue()
    start_at = time.time() + 3.0 + 0.5 * len(groups)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_node_process, args=(url, str(base), g, plan, size, start_at,
                                                     queue)) for g in groups]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time() - 0.2))
    sampler.start()
    results = [r for _ in procs for r in queue.get(timeout=900)]
    for p in procs:
        p.join()
    sampler.stop.set()
    sampler.join()
    calls = command_counts(client)
    calls.pop("info", None)
    calls.pop("config|resetstat", None)
    writes = write_commands(client, calls)
    total = sum(calls.values())
    written = sum(v for k, v in calls.items() if k in writes)
    out_bytes = int(client.info("stats")["total_net_output_bytes"]) - before_out
    cpu = _cpu(client) - before_cpu
    seconds = [r.get("seconds", 0) for r in results]
    return {"nodes": n, "compiled_nodes": sum(1 for r in results if r["compiled"] != 0),
            "errors": [r["error"] for r in results if "error" in r][:3],
            "used_memory_before": before_mem, "used_memory_peak": sampler.peak,
            "commands_per_join": round(total / n, 1), "writes_per_join": round(written / n, 1),
            "write_share": round(written / total, 4) if total else 0.0,
            "writes": {k: v for k, v in sorted(calls.items()) if k in writes},
            "bytes_sent_per_join": out_bytes // n,
            "redis_cpu_ms_per_join": round(1000 * cpu / n, 2),
            "join_seconds_max": max(seconds), "join_seconds_median": statistics.median(seconds),
            "store_retries": sum(r.get("counters", {}).get("store_retries", 0)
                                 for r in results),
            "store_unreachable": sum(r.get("counters", {}).get("store_unreachable", 0)
                                     for r in results)}


def bench_redis(args) -> dict:
    plan = plan_of(args.entries)
    out = {"entries": args.entries, "entry_bytes": args.size, "tasks": len(plan),
           "runs": []}
    with tempfile.TemporaryDirectory(prefix="warmd-fanout-") as tmp_name:
        tmp = Path(tmp_name)
        server = start_server(tmp / "redis", appendonly=False)
        client = server.client()
        try:
            register_testlib()
            empty = int(client.info("memory")["used_memory"])
            packed = publish(server.url, tmp, plan, args.size)
            out["dataset_bytes"] = sum(len(b) for b in packed.values())
            out["used_memory_empty"] = empty
            out["used_memory_published"] = int(client.info("memory")["used_memory"])
            for n in args.nodes:
                for run in range(args.runs if n >= max(args.nodes) else 1):
                    base = tmp / f"run-{n}-{run}"
                    result = redis_run(server.url, client, base, plan, args.size, n,
                                       args.processes)
                    result["run"] = run
                    out["runs"].append(result)
                    print(json.dumps({k: v for k, v in result.items() if k != "writes"}),
                          file=sys.stderr, flush=True)
                    _remove(base)
        finally:
            client.close()
            server.stop()
    return out


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --- ray: fan-out between nodes ---------------------------------------------------------

class Joiner:
    """A node's join as an actor pinned to that node (what its agent does: the peer client
    of warmd.cluster.fanout handed to the shared cache)."""

    def __init__(self, url: str, root: str, node: str, plan: dict, size: int) -> None:
        from warmd.cluster.fanout import join_peers

        register_testlib()
        self.url, self.root, self.node, self.plan, self.size = url, Path(root), node, plan, size
        self.peers = join_peers(node)

    def join(self) -> dict:
        from testlib.cache import DirAdapter

        from warmd.cache.records import entry_digest

        result = join(self.url, self.root, self.node, self.plan, self.size, peers=self.peers)
        result["installed"] = {e.name: entry_digest(e.path)
                               for e in DirAdapter(self.root).list_entries()}
        return result

    def lie(self, blobs: dict[str, bytes]) -> int:
        """Offer every blob with one bit flipped in its middle, as a broken peer would."""
        flipped = {d: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 1]) + b[len(b) // 2 + 1:]
                   for d, b in blobs.items()}
        self.peers.offer(flipped)
        return len(flipped)


def bench_ray(args) -> dict:
    import hashlib

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from testlib.cache import DirAdapter

    from warmd.cache.records import entry_digest
    from warmd.cluster import RAY_NAMESPACE

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    plan = plan_of(args.entries)
    node_args = {"num_cpus": 1, "object_store_memory": args.object_store_mb << 20}
    out: dict = {"entries": args.entries, "entry_bytes": args.size, "joiners": args.joiners}
    with tempfile.TemporaryDirectory(prefix="warmd-fanout-ray-") as tmp_name:
        tmp = Path(tmp_name)
        server = start_server(tmp / "redis", appendonly=False)
        client = server.client()
        cluster = None
        try:
            register_testlib()
            packed = publish(server.url, tmp, plan, args.size)
            out["dataset_bytes"] = sum(len(b) for b in packed.values())
            published = {e.name: entry_digest(e.path)
                         for e in DirAdapter(tmp / "publisher").list_entries()}
            began = time.monotonic()
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 0, "object_store_memory": args.object_store_mb << 20})
            ray.init(address=cluster.address, namespace=RAY_NAMESPACE,
                     logging_level="ERROR", log_to_driver=False)
            actor = ray.remote(num_cpus=0)(Joiner)

            def on_new_node(name: str):
                node = cluster.add_node(**node_args)
                cluster.wait_for_nodes()
                return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node.node_id, soft=False)).remote(server.url, str(tmp / name), name, plan,
                                                      args.size)

            def sent() -> int:
                return int(client.info("stats")["total_net_output_bytes"])

            first = on_new_node("warm")
            before = sent()
            warm_join = ray.get(first.join.remote(), timeout=600)
            out["first_node"] = {"redis_bytes": sent() - before,
                                 **_summary(warm_join, published)}
            # a broken peer: it offers every blob with one bit flipped; the next node is
            # sent to it first (it served least, and sorts first)
            liar = on_new_node("a-liar")
            blobs = {hashlib.sha256(b).hexdigest(): b for b in packed.values()}
            ray.get(liar.lie.remote(blobs), timeout=120)
            probe = on_new_node("after-liar")
            before = sent()
            got = ray.get(probe.join.remote(), timeout=600)
            out["after_liar"] = {"redis_bytes": sent() - before, **_summary(got, published)}
            joiners = [on_new_node(f"join{i:02d}") for i in range(args.joiners)]
            out["cluster_seconds"] = round(time.monotonic() - began, 1)
            ray.get([j.__ray_ready__.remote() for j in joiners], timeout=600)
            before = sent()
            results = ray.get([j.join.remote() for j in joiners], timeout=900)
            served = sent() - before
            out["joining"] = {"redis_bytes_per_node": served // args.joiners,
                              "redis_bytes_per_node_before": out["dataset_bytes"],
                              "nodes": [_summary(r, published) for r in results]}
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            client.close()
            server.stop()
    return out


def _summary(result: dict, published: dict[str, str]) -> dict:
    counters = result.get("counters", {})
    return {"node": result["node"], "seconds": result["seconds"],
            "compiled": result["compiled"], "failed": result["failed"],
            "remote_hits": result["remote_hits"],
            "warm": result["compiled"] == 0 and result["failed"] == 0,
            "identical": result.get("installed") == published,
            "peer_hits": counters.get("peer_hits", 0),
            "bytes_from_peers": counters.get("bytes_from_peers", 0),
            "peer_refused": counters.get("peer_refused", 0)}


# --- main -------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    red = sub.add_parser("redis", help="N nodes joining at once against one redis-server")
    red.add_argument("--nodes", default="1,32,128")
    red.add_argument("--runs", type=int, default=3, help="runs of the largest N")
    red.add_argument("--processes", type=int, default=4)
    ray_p = sub.add_parser("ray", help="fan-out between the nodes of a Ray cluster")
    ray_p.add_argument("--joiners", type=int, default=16)
    ray_p.add_argument("--object-store-mb", type=int, default=80)
    for p in (red, ray_p):
        p.add_argument("--entries", type=int, default=60)
        p.add_argument("--size", type=int, default=120_000)
        p.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.mode == "redis":
        try:
            args.nodes = sorted({int(n) for n in args.nodes.split(",")})
        except ValueError:
            parser.error("--nodes takes numbers, e.g. 1,32,128")
        result = bench_redis(args)
    else:
        result = bench_ray(args)
    print(json.dumps(result, indent=2) if args.json else _text(result))


def _text(result: dict) -> str:
    lines = [f"{k}: {v}" for k, v in result.items() if k != "runs"]
    for run in result.get("runs", []):
        lines.append(", ".join(f"{k}={v}" for k, v in run.items() if k != "writes"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
