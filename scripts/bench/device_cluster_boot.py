"""Cluster boot on one GPU node (issue 21): K `warmd warmup` nodes cold at once against one
store, each its own DG_JIT_CACHE_DIR, state dir and process, sharing the one GPU, against
one node alone in the same run. Run by scripts/bench/device_cluster_boot.sh on the H200; results
in docs/benchmarks.md.

    python scripts/bench/device_cluster_boot.py run --out DIR [--budget S] [--models qwen,dsv3]
        [--nodes 2,4] [--redis URL]

For each model: one node alone, then K nodes at once for each K (the store flushed before
each), every node `warmd warmup <plan> --redis URL --json`. Checks, per run: every node
succeeded; the compiles summed over the nodes == the distinct entries the nodes hold (and
== the nvcc runs summed); every node holds every entry; wall time against the one node
alone (goal: at most 1.15x: the nodes share the device's cores, so equal total work is
equal time). The projection to K machines: discovery plus the largest node's nvcc seconds
over the cores. Then a builder-style build of the published kernel list's jobs (nvcc on the
CPU, no GPU used) into an empty root, compared with a GPU node's entries: names and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from step_runner import BenchRun

ROOT = Path(__file__).resolve().parents[2]
PLANS = {
    "qwen": ["--model", "qwen3-30b-a3b-fp8"],
    "dsv3": ["--model", "deepseek-v3", "--tp", "8"],
}
PLAN_ARGS = ["--max-tokens", "8192", "--mode", "relax", "--library", "deep_gemm"]
LIMIT = 1.15


def parse_nodes(text: str) -> list[int]:
    """'2,4' -> [2, 4]; ValueError naming the bad value."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 2:
            raise ValueError(f"--nodes takes counts of 2 or more, got {part!r}")
        values.append(int(part))
    if not values:
        raise ValueError("--nodes is empty")
    return sorted(set(values))


def parse_models(text: str) -> list[str]:
    models = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in models if m not in PLANS]
    if unknown or not models:
        raise ValueError(f"--models takes {', '.join(PLANS)}; got {text!r}")
    return models


def entries(root: Path) -> dict[str, Path]:
    cache = root / "cache"
    if not cache.is_dir():
        return {}
    # .warmd-staging (where installs unpack) is warmd's, not an entry
    return {p.name: p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")}


def node_row(report: dict | None, rc, wall: float, held: set[str]) -> dict:
    """One node's part of a run, from its --json report."""
    stages = (report or {}).get("kernel_stages") or [{}]
    stage = stages[0]
    cluster = (report or {}).get("cluster") or {}
    return {"rc": rc, "wall": round(wall, 3),
            "compiled": ((report or {}).get("kernels") or {}).get("compiled", 0),
            "remote_hits": ((report or {}).get("kernels") or {}).get("remote_hits", 0),
            "nvcc_runs": stage.get("nvcc_runs", 0), "nvcc_seconds": stage.get("nvcc_seconds"),
            "distinct_sources": stage.get("distinct_sources"),
            "compiled_in_discovery": stage.get("compiled_in_discovery"),
            "discovery_seconds": stage.get("discovery_seconds"),
            "kernel_list": (stage.get("cluster") or {}).get("kernel_list"),
            "installed": cluster.get("installed", 0), "waited": cluster.get("waited", 0),
            "held": len(held), "timeline": cluster.get("timeline")}


def judge_run(run: dict, alone_wall: float | None, cores: int) -> dict:
    """The checks of one run (K nodes, or the one alone): summed compiles == distinct
    entries == summed nvcc runs, every node holds every entry, every node ok, and the wall
    time against the node alone; plus the projection to K machines."""
    nodes = run["nodes"]
    distinct = run["distinct_entries"]
    checks = {
        "all_ok": all(n["rc"] == 0 for n in nodes),
        "compiles_equal_distinct": sum(n["compiled"] for n in nodes) == distinct,
        "nvcc_runs_equal_distinct": sum(n["nvcc_runs"] for n in nodes) == distinct,
        "every_node_holds_every_entry": all(n["held"] == distinct for n in nodes),
    }
    out = {"summed_compiles": sum(n["compiled"] for n in nodes),
           "summed_nvcc_runs": sum(n["nvcc_runs"] for n in nodes), "checks": checks}
    if alone_wall and len(nodes) > 1:
        ratio = run["wall"] / alone_wall
        out["ratio_to_alone"] = round(ratio, 3)
        checks["within_goal"] = ratio <= LIMIT
        discovery = max((n["discovery_seconds"] or 0.0) for n in nodes)
        busiest = max((n["nvcc_seconds"] or 0.0) for n in nodes)
        out["projected_k_machines"] = round(discovery + busiest / max(1, cores), 3)
    return out


def builder_compare(gpu_root: Path, built: dict[str, dict[str, bytes]]) -> dict:
    """Each builder-built entry against the GPU node's: same names, same files, same bytes."""
    gpu = entries(gpu_root)
    missing = sorted(n for n in built if n not in gpu)
    differ = []
    for name, files in built.items():
        if name not in gpu:
            continue
        theirs = {p.name: p.read_bytes() for p in gpu[name].iterdir()}
        if theirs != files:
            differ.append({"entry": name, "files": sorted(set(theirs) ^ set(files)) or
                           sorted(f for f in files if files[f] != theirs.get(f))})
    return {"built": len(built), "missing_on_gpu_node": missing, "differ": differ,
            "identical": not missing and not differ and bool(built)}


class Bench(BenchRun):
    RESULTS_FILE = "cluster_boot.json"

    def __init__(self, out: Path, budget: float, url: str) -> None:
        self.cores = len(os.sched_getaffinity(0))
        super().__init__(out, budget, {"budget_s": budget, "cores": self.cores, "runs": {},
                                       "builder": {}})
        self.url = url

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()

    def nodes(self, model: str, k: int, label: str) -> dict | None:
        """K nodes of one model cold at once; None when the budget is short."""
        need = 60.0 if k == 1 else 75.0
        if self.left() < need:
            self.log(f"SKIP {label}: {self.left():.0f}s left, needs ~{need:.0f}s")
            self.results["runs"][label] = {"skipped": f"needs ~{need:.0f}s"}
            return None
        self.flush()
        work = self.out / "work" / label
        procs = []
        began = time.monotonic()
        for i in range(k):
            node = work / f"n{i}"
            node.mkdir(parents=True)
            env = {**os.environ, "DG_JIT_CACHE_DIR": str(node / "dg"),
                   "WARMD_STATE_DIR": str(node / "state"), "WARMD_NODE_NAME": f"{label}-{i}"}
            argv = [sys.executable, "-m", "warmd", "warmup", *PLANS[model], *PLAN_ARGS,
                    "--redis", self.url, "--json"]
            procs.append((node, subprocess.Popen(argv, env=env, cwd=ROOT, text=True,
                                                 stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE)))
        reports = []
        for node, proc in procs:
            try:
                out, err = proc.communicate(timeout=max(10.0, self.left() - 5))
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                rc = "timeout"
            wall = time.monotonic() - began
            try:
                report = json.loads(out)
            except ValueError:
                report = None
            reports.append((node, report, rc, wall, err))
        saved = self.out / "reports"
        saved.mkdir(exist_ok=True)
        for i, (_node, report, *_rest) in enumerate(reports):
            (saved / f"{label}-n{i}.json").write_text(json.dumps(report, indent=1))
        wall = max(r[3] for r in reports)
        held = [set(entries(node / "dg")) for node, *_rest in reports]
        distinct = set().union(*held)
        run = {"model": model, "k": k, "wall": round(wall, 3),
               "distinct_entries": len(distinct),
               "nodes": [node_row(report, rc, w, h) for (_n, report, rc, w, _e), h
                         in zip(reports, held, strict=True)],
               "stderr_tail": [[ln for ln in e.splitlines() if ln.strip()][-5:]
                               for *_r, e in reports if e]}
        self.results["runs"][label] = run
        self.save()
        return run

    def builder(self, model: str, gpu_root: Path, limit: int) -> None:
        """A builder's build of the list's jobs (up to limit) beside a GPU node's entries."""
        if self.left() < 45:
            self.results["builder"][model] = {"skipped": "budget"}
            return
        from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
        from warmd.libraries.deep_gemm.compiler import real_nvcc
        from warmd.libraries.deep_gemm.install import resolve
        from warmd.libraries.deep_gemm.listed import ListedJob, build_entry, task_digest
        from warmd.plan import PlanRequest, make_plan
        from warmd.store import open_shared_cache
        from warmd.targets import detect_local_gpus

        plan = make_plan(PlanRequest(model=PLANS[model][1], tp=int(PLANS[model][3])
                                     if len(PLANS[model]) > 2 else 1, max_tokens=8192,
                                     mode="relax"))
        tasks = [t for t in plan.tasks if t.library == "deep_gemm"]
        gpu = detect_local_gpus()[0]
        root = self.out / "work" / f"builder-{model}"
        adapter = DeepGemmCacheAdapter(root).for_gpu(gpu.arch, gpu.sms)
        shared = open_shared_cache(self.url, node="builder")
        listing = shared.kernel_list(adapter, [task_digest(t) for t in tasks])
        shared.close()
        jobs = [ListedJob.from_json(j) for j in listing.jobs.values()][:limit]
        found = resolve()
        include = str(found.location / "include") if found else ""
        began = time.monotonic()

        def one(job: ListedJob) -> str | None:
            return build_entry(root / "run", job, real_nvcc(), root, include)

        with ThreadPoolExecutor(self.cores) as pool:
            failures = [f for f in pool.map(one, jobs) if f]
        built = {name: {p.name: p.read_bytes() for p in path.iterdir()}
                 for name, path in entries(root).items()}
        row = {"listed_tasks": len(listing.tasks), "listed_jobs": len(listing.jobs),
               "refused": listing.refused, "failures": failures[:3],
               "seconds": round(time.monotonic() - began, 3),
               **builder_compare(gpu_root, built)}
        self.results["builder"][model] = row
        self.save()
        self.log(f"builder {model}: {row['built']} built, identical={row['identical']}")


def run(out: Path, budget: float, models: list[str], ks: list[int], url: str,
        builder_jobs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, budget, url)
    for model in models:
        alone = bench.nodes(model, 1, f"{model}-alone")
        if alone is not None:
            alone.update(judge_run(alone, None, bench.cores))
            bench.log(f"{model} alone: {alone['wall']} s, {alone['summed_compiles']} "
                      f"compiled, {alone['distinct_entries']} entries")
        for k in ks:
            row = bench.nodes(model, k, f"{model}-k{k}")
            if row is None:
                continue
            row.update(judge_run(row, alone["wall"] if alone else None, bench.cores))
            bench.log(f"{model} K={k}: {row['wall']} s ({row.get('ratio_to_alone')}x alone), "
                      f"{row['summed_compiles']} compiled for {row['distinct_entries']} "
                      f"entries; checks {row['checks']}")
            if k == ks[0]:
                bench.builder(model, out / "work" / f"{model}-k{k}" / "n0" / "dg",
                              builder_jobs)
        bench.save()
    checks = [ok for r in bench.results["runs"].values() for ok in
              (r.get("checks") or {}).values()]
    checks += [b.get("identical", False) for b in bench.results["builder"].values()
               if "skipped" not in b]
    bench.results["all_checks_hold"] = all(checks) and bool(checks)
    bench.save()
    bench.log(f"all checks hold: {bench.results['all_checks_hold']}")
    return 0 if bench.results["all_checks_hold"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=440.0)
    parser.add_argument("--models", default="qwen,dsv3")
    parser.add_argument("--nodes", default="2,4")
    parser.add_argument("--redis", default=None, help="the store every node shares "
                                                      "(default: a server this run starts)")
    parser.add_argument("--builder-jobs", type=int, default=32,
                        help="how many listed jobs the builder-style build compiles")
    opts = parser.parse_args(argv)
    try:
        models, ks = parse_models(opts.models), parse_nodes(opts.nodes)
    except ValueError as exc:
        print(f"device_cluster_boot: {exc}", file=sys.stderr)
        return 2
    if opts.budget <= 0 or opts.builder_jobs < 0:
        print("device_cluster_boot: --budget and --builder-jobs must be positive",
              file=sys.stderr)
        return 2
    server = None
    url = opts.redis
    if url is None:
        from warmd.store import start_server

        server = start_server(opts.out / "redis", appendonly=False)
        url = server.url
    try:
        return run(opts.out, opts.budget, models, ks, url, opts.builder_jobs)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
