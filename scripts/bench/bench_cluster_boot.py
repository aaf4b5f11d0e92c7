"""Cluster boot: K nodes cold at once against one store, each kernel compiled once in the
whole cluster, the work split across the nodes (docs/benchmarks.md, issue 21).

Every node is a separate process with its own cache root, against one real redis-server
this script starts (or --redis). Modes:

    testlib     the tests' library (tests/testlib): T tasks, N kernels, each compile a
                sleep of S seconds (so the 2 cores are not the limit), W workers per node
    flashinfer  `warmd warmup` with real FlashInfer module builds (nvcc, sm_90a), each node
                its own FLASHINFER_WORKSPACE_BASE
    ray         `warmd start` on a ray.cluster_utils.Cluster of K nodes joining at once
                (testlib tasks through the daemon's agents)

For each K: wall time from the common start (testlib: every node process started, imported
and planned, then all released at once; flashinfer, ray: from the first spawn) to the last
node's exit, each node's kernels
compiled / installed from peers / waited for, the compiles summed over the nodes against
the distinct kernels (and, for testlib, the compile log every real compile writes), and
the wall time against one node alone divided by K.

    python3 scripts/bench/bench_cluster_boot.py testlib --nodes 1,2,4,8 --json /tmp/boot.json
    python3 scripts/bench/bench_cluster_boot.py flashinfer --nodes 1,2,4
    python3 scripts/bench/bench_cluster_boot.py ray --nodes 4
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

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# Llama 3.1 8B on SGLang with FlashInfer attention: silu_and_mul and the bf16 head-dim-128
# batch decode (the plan's prefill and sampling modules take many minutes on 2 cores)
FI_FILTER = "silu_and_mul|batch_decode"


def _env(extra: dict | None = None) -> dict:
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep), "RAY_AUTH_MODE": "disabled",
            "WARMD_LIBRARY_PACKAGES": "testlib.library", **(extra or {})}


def kernel_names(tasks: int, kernels: int) -> dict[str, list[str]]:
    """{task key: its entry names}: kernels spread over tasks as evenly as they go."""
    plan: dict[str, list[str]] = {f"testlib/boot/{t:02d}": [] for t in range(tasks)}
    keys = list(plan)
    for i in range(kernels):
        plan[keys[i % tasks]].append(f"kernel.boot{i:03d}.{i:08x}")
    return plan


# -- one testlib node (run as a child process) ------------------------------------------------

def run_node(args: argparse.Namespace) -> int:
    """One node: warmd's run_warmup over a testlib plan, against the store."""
    import dataclasses

    from testlib import LIBRARY_MODULE, NAME

    from warmd import libraries
    from warmd.plan import PlanRequest, make_plan
    from warmd.store import open_shared_cache
    from warmd.tasks import Task
    from warmd.warmup import WarmupOptions, run_warmup

    entered = time.time()
    libraries.register(LIBRARY_MODULE)
    spec = json.loads(args.spec)
    base = make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200", engine="sglang",
                                 without_libs=("sgl_kernel",)))
    tasks = tuple(Task(NAME, "write_entries", key=key, spec={
        "entries": names, "size": spec["size"], "seconds": spec["seconds"],
        "log": spec["log"]}) for key, names in sorted(spec["plan"].items()))
    plan = dataclasses.replace(base, tasks=tasks)
    shared = open_shared_cache(spec["url"], node=spec["node"])
    options = WarmupOptions(workers=spec["workers"], gpu_ids=(),
                            cache_roots={NAME: Path(spec["root"])})
    Path(spec["ready"]).touch()  # started, imported and planned: waiting for the others
    while not Path(spec["go"]).exists():
        time.sleep(0.005)
    began = time.time()
    report = run_warmup(plan, options, shared=shared)
    ran = time.time()
    shared.close()
    data = report.to_json()
    data.pop("task_details")
    # wall clock moments of this process (the parent compares them with its own start)
    data["moments"] = {"entered": entered, "run_began": began, "run_ended": ran,
                       "closed": time.time()}
    print(json.dumps(data))
    return 0 if not report.failed else 1


# -- the measured runs --------------------------------------------------------------------------

def _start_store(tmp: Path, url: str | None):
    if url:
        return None, url
    from warmd.store import start_server

    server = start_server(tmp / "redis", appendonly=False)
    return server, server.url


def _flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()


def testlib_run(k: int, tmp: Path, url: str, opts: argparse.Namespace) -> dict:
    plan = kernel_names(opts.tasks, opts.kernels)
    log = tmp / f"k{k}-compiles.log"
    procs, ready = [], []
    go = tmp / f"k{k}-go"
    spawned = time.monotonic()
    for i in range(k):
        ready.append(tmp / f"k{k}-ready-{i}")
        spec = {"url": url, "node": f"node-{k}-{i}", "root": str(tmp / f"k{k}" / f"n{i}"),
                "plan": plan, "seconds": opts.seconds, "size": opts.size, "log": str(log),
                "workers": opts.workers, "ready": str(ready[-1]), "go": str(go)}
        procs.append(subprocess.Popen([sys.executable, __file__, "node", json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=_env(), cwd=ROOT))
    # Every node process started, imported warmd and planned (on this machine's 2 cores,
    # K Python start-ups at once take seconds that K machines would not): then all go.
    while not all(r.exists() for r in ready):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    began, began_wall = time.monotonic(), time.time()
    started_s = round(began - spawned, 3)
    go.touch()
    nodes = []
    for out, wall in _outputs(procs, began, opts.timeout):
        data = json.loads(out.strip().splitlines()[-1])
        data["wall"] = wall
        data["moments"] = {k: round(v - began_wall, 3) for k, v in data["moments"].items()}
        nodes.append(data)
    wall = round(time.monotonic() - began, 3)
    done = [line.split()[2] for line in log.read_text().splitlines()
            if line.split()[1] == "done"] if log.exists() else []
    summary = _summary(k, wall, nodes, distinct=opts.kernels, logged=len(done),
                       logged_distinct=len(set(done)))
    summary["process_start_s"] = started_s  # before the common start, not in wall
    return summary


def _summary(k: int, wall: float, nodes: list[dict], distinct: int,
             logged: int | None = None, logged_distinct: int | None = None) -> dict:
    rows = [{"compiled": n["kernels"]["compiled"],
             "installed": (n.get("cluster") or {}).get("installed", 0),
             "remote_hits": n["kernels"]["remote_hits"],
             "waited": (n.get("cluster") or {}).get("waited", 0),
             "took_over": (n.get("cluster") or {}).get("took_over", 0),
             "seconds": n.get("seconds"), "wall": n.get("wall"),
             "moments": n.get("moments"),
             "timeline": (n.get("cluster") or {}).get("timeline")} for n in nodes]
    return {"k": k, "wall": wall, "distinct_kernels": distinct,
            "summed_compiles": sum(r["compiled"] for r in rows),
            "compile_log": logged, "compile_log_distinct": logged_distinct, "nodes": rows}


def judge(results: list[dict], limit: float) -> list[str]:
    """Each run against one node alone (K=1 in the same results) divided by K: the ratio
    wall / (one / K), and whether compiles summed == distinct kernels. Fills in
    `ideal` and `ratio`; returns the failures."""
    one = next((r["wall"] for r in results if r["k"] == 1), None)
    failures = []
    for r in results:
        if r["summed_compiles"] != r["distinct_kernels"]:
            failures.append(f"K={r['k']}: {r['summed_compiles']} compiles for "
                            f"{r['distinct_kernels']} kernels")
        if r.get("compile_log") is not None and r["compile_log"] != r["distinct_kernels"]:
            failures.append(f"K={r['k']}: the compile log has {r['compile_log']} compiles")
        if one is None or r["k"] == 1:
            continue
        r["ideal"] = round(one / r["k"], 3)
        r["ratio"] = round(r["wall"] / r["ideal"], 3)
        if r["ratio"] > limit:
            failures.append(f"K={r['k']}: {r['wall']} s is {r['ratio']}x of one node / K "
                            f"({r['ideal']} s; at most {limit}x)")
    return failures


def flashinfer_run(k: int, tmp: Path, url: str, opts: argparse.Namespace) -> dict:
    """K `warmd warmup` processes of small FlashInfer modules, each its own workspace."""
    procs = []
    began = time.monotonic()
    for i in range(k):
        node = tmp / f"fi{k}" / f"n{i}"
        node.mkdir(parents=True)
        env = _env({"FLASHINFER_WORKSPACE_BASE": str(node / "ws"),
                    "WARMD_STATE_DIR": str(node / "state"), "WARMD_NODE_NAME": f"fi-{k}-{i}"})
        env.pop("WARMD_LIBRARY_PACKAGES")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "warmd", "warmup", "--model", "llama-3.1-8b", "--target",
             "h200", "--engine", "sglang", "--attention-backend", "flashinfer", "--with",
             "flashinfer", "--library", "flashinfer",
             "--task-filter", opts.filter, "--redis", url, "--workers", str(opts.workers),
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=node))
    nodes = [{**json.loads(out), "wall": wall}
             for out, wall in _outputs(procs, began, opts.timeout)]
    wall = round(time.monotonic() - began, 3)
    distinct = len({k["name"] for n in nodes for d in n["task_details"] for k in d["kernels"]})
    return _summary(k, wall, nodes, distinct)


def _outputs(procs: list[subprocess.Popen], began: float, timeout: float
             ) -> list[tuple[str, float]]:
    """Each node's stdout and its wall time from the common start; SystemExit (with its
    stderr's tail) for a node that failed."""
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        ended = time.monotonic()
        if proc.returncode != 0:
            raise SystemExit(f"a node failed (exit {proc.returncode}):\n{err[-3000:]}")
        outputs.append((out, round(ended - began, 3)))
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    node = sub.add_parser("node", help=argparse.SUPPRESS)
    node.add_argument("spec")
    for name in ("testlib", "flashinfer", "ray"):
        p = sub.add_parser(name)
        p.add_argument("--nodes", default="1,2,4,8" if name != "ray" else "3",
                       help="comma-separated K values (1 = one node alone, the baseline)")
        p.add_argument("--redis", default=None, help="a store URL (default: a redis-server "
                                                     "this script starts)")
        p.add_argument("--workers", type=int, default=1, help="compile jobs per node")
        p.add_argument("--timeout", type=float, default=900.0)
        p.add_argument("--limit", type=float, default=1.3,
                       help="wall at most this times one node's / K")
        p.add_argument("--json", type=Path, default=None, help="write the results here")
        p.add_argument("--keep", action="store_true", help="keep the scratch directory")
        if name in ("testlib", "ray"):
            p.add_argument("--tasks", type=int, default=8)
            p.add_argument("--kernels", type=int, default=60)
            p.add_argument("--seconds", type=float, default=1.0, help="each compile sleeps")
            p.add_argument("--size", type=int, default=20_000, help="bytes per entry")
        if name == "flashinfer":
            p.add_argument("--filter", default=FI_FILTER, help="the modules (task filter)")
    opts = parser.parse_args(argv)
    if opts.mode == "node":
        return run_node(opts)
    try:
        ks = [int(v) for v in opts.nodes.split(",") if v.strip()]
    except ValueError:
        print(f"bench_cluster_boot: --nodes takes numbers: {opts.nodes!r}", file=sys.stderr)
        return 2
    if not ks or min(ks) < 1:
        print("bench_cluster_boot: --nodes needs K >= 1", file=sys.stderr)
        return 2
    if opts.mode == "ray":
        from bench_cluster_ray import ray_run  # noqa: PLC0415 (Ray only for this mode)

        results = [ray_run(k, opts) for k in ks]
        failures = judge(results, opts.limit)
        _emit(opts, results, failures)
        return 1 if failures else 0
    tmp = Path(tempfile.mkdtemp(prefix="warmd-boot-"))
    server, url = _start_store(tmp, opts.redis)
    results = []
    try:
        for k in ks:
            _flush(url)
            run = testlib_run if opts.mode == "testlib" else flashinfer_run
            results.append(run(k, tmp, url, opts))
            r = results[-1]
            print(f"K={k}: {r['wall']:.1f} s, {r['summed_compiles']} compiles for "
                  f"{r['distinct_kernels']} kernels; per node compiled/installed/waited: "
                  + " ".join(f"{n['compiled']}/{n['installed']}/{n['waited']}"
                             for n in r["nodes"]), file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
        if not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    failures = judge(results, opts.limit)
    _emit(opts, results, failures)
    return 1 if failures else 0


def _emit(opts: argparse.Namespace, results: list[dict], failures: list[str]) -> None:
    out = {"mode": opts.mode, "argv": sys.argv[1:], "results": results, "failures": failures}
    if opts.json:
        opts.json.write_text(json.dumps(out, indent=2) + "\n")
    for r in results:
        extra = f", {r['ratio']}x of one/K ({r['ideal']} s)" if "ratio" in r else ""
        print(f"K={r['k']}: wall {r['wall']} s{extra}; compiles {r['summed_compiles']} / "
              f"{r['distinct_kernels']} distinct")
    for failure in failures:
        print(f"FAIL {failure}")


if __name__ == "__main__":
    sys.exit(main())
