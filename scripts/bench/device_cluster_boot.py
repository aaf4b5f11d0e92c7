"""Cluster boot on one GPU node (issue 21): K `warmd warmup` nodes cold at once against one
store, each its own DG_JIT_CACHE_DIR, state dir and process, sharing the one GPU, against
one node alone in the same run. Run by scripts/bench/device_cluster_boot.sh on the H200; results
in docs/benchmarks.md.

    python scripts/bench/device_cluster_boot.py run --out DIR [--budget S] [--models qwen,dsv3]
        [--nodes 2,4] [--redis URL] [--pinned]

For each model: one node alone, then K nodes at once for each K (the store flushed before
each), every node `warmd warmup <plan> --redis URL --json`. Checks, per run: every node
succeeded; the compiles summed over the nodes == the distinct entries the nodes hold (and
== the nvcc runs summed); every node holds every entry; wall time against the one node
alone (goal: at most 1.15x: the nodes share the device's cores, so equal total work is
equal time). The projection to K machines: discovery plus the largest node's nvcc seconds
over the cores. Then a builder-style build of the published kernel list's jobs (nvcc on the
CPU, no GPU used) into an empty root, compared with a GPU node's entries: names and bytes.

--pinned (issue 30): K machines of C = cores // K cores each, emulated by pinning each node's
process (its workers, discovery processes and nvcc inherit the affinity) to its own C cores;
for each K, one node alone pinned to the first C cores, then the K nodes each pinned to their
C. Checks, per K run, besides the counts above (cluster_boot_checks.py): wall / (alone / K)
within PINNED_LIMITS[K]; the spread of the nodes' READY (each one's exit, from the common
start) within SPREAD_LIMIT of the wall; each node sized its compile jobs to its C cores
(warmd's sizing reads the affinity); every node holds every entry the node alone holds. No
builder build.

--loaded (with --pinned): for each K also K nodes alone at once, each pinned to its own C
cores and each with its own store, so that none shares work with another: the node alone
measured on a box whose other cores are as busy as in the K run (the K emulated machines
share one socket, its clock and memory; K real machines would not). The K run is then
also judged against their mean READY (``ratio_to_loaded_alone_over_k``), beside the node
alone on a quiet box, which stays the check of record.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from cluster_boot_checks import (
    PLANS,
    builder_compare,
    core_slices,
    entries,
    judge_pinned,
    judge_run,
    loaded_ratio,
    node_row,
    parse_counts,
    parse_models,
    parse_nodes,
    pinned_need,
    pinned_sizing_holds,
)
from step_runner import BenchRun

ROOT = Path(__file__).resolve().parents[2]
PLAN_ARGS = ["--max-tokens", "8192", "--mode", "relax", "--library", "deep_gemm"]


class Bench(BenchRun):
    RESULTS_FILE = "cluster_boot.json"

    def __init__(self, out: Path, budget: float, url: str) -> None:
        self.cores = len(os.sched_getaffinity(0))
        super().__init__(out, budget, {"budget_s": budget, "cores": self.cores, "runs": {},
                                       "builder": {}})
        self.url = url
        self.held: dict[str, list[set[str]]] = {}  # run label -> each node's entry names
        self.servers: list = []  # the stores of --loaded's nodes alone, beside url's

    def own_stores(self, k: int) -> list[str]:
        """k stores: the bench's own and k - 1 more servers (started once, kept)."""
        from warmd.store import start_server

        while len(self.servers) < k - 1:
            path = self.out / "work" / f"redis-{len(self.servers) + 1}"
            self.servers.append(start_server(path, appendonly=False))
        return [self.url, *(s.url for s in self.servers[:k - 1])]

    def close(self) -> None:
        for server in self.servers:
            server.stop()

    def flush(self, url: str) -> None:
        import redis

        client = redis.Redis.from_url(url)
        client.flushall()
        client.close()

    def nodes(self, model: str, placement: list[list[int] | None], label: str,
              need: float, extra_env: dict[str, str] | None = None,
              urls: list[str] | None = None) -> dict | None:
        """One node per placement (the cores it is pinned to; None: not pinned) of one model,
        cold at once, node i on store urls[i] (default: all on the bench's one); None when
        the budget has not the need seconds left (said and kept)."""
        if self.left() < need:
            self.log(f"SKIP {label}: {self.left():.0f}s of the budget left, needs ~{need:.0f}s")
            self.results["runs"][label] = {"skipped": f"needs ~{need:.0f}s, "
                                                      f"{self.left():.0f}s left"}
            return None
        urls = urls or [self.url] * len(placement)
        for url in sorted(set(urls)):
            self.flush(url)
        work = self.out / "work" / label
        procs = []
        began = time.monotonic()
        for i, cores in enumerate(placement):
            node = work / f"n{i}"
            node.mkdir(parents=True)
            env = {**os.environ, "DG_JIT_CACHE_DIR": str(node / "dg"),
                   "WARMD_STATE_DIR": str(node / "state"), "WARMD_NODE_NAME": f"{label}-{i}",
                   **(extra_env or {})}
            argv = [sys.executable, "-m", "warmd", "warmup", *PLANS[model], *PLAN_ARGS,
                    "--redis", urls[i], "--json"]
            # the node's process and all it starts (workers, discovery, nvcc) keep its cores
            pin = partial(os.sched_setaffinity, 0, cores) if cores is not None else None
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, preexec_fn=pin)
            procs.append((node, proc, len(os.sched_getaffinity(proc.pid))
                          if cores is not None else None))
        # one thread per node: each one's exit time is its own, and no pipe fills unread
        with ThreadPoolExecutor(len(procs)) as pool:
            waited = list(pool.map(lambda p: self._wait(p[1], began), procs))
        saved = self.out / "reports"
        saved.mkdir(exist_ok=True)
        for i, (report, *_rest) in enumerate(waited):
            (saved / f"{label}-n{i}.json").write_text(json.dumps(report, indent=1))
        wall = max(w[2] for w in waited)
        held = [set(entries(node / "dg")) for node, *_rest in procs]
        distinct = set().union(*held)
        self.held[label] = held
        run = {"model": model, "k": len(placement), "wall": round(wall, 3),
               "cores_per_node": len(placement[0]) if placement[0] is not None else None,
               "pinned": [[c[0], c[-1]] if c else None for c in placement],
               "distinct_entries": len(distinct),
               "nodes": [node_row(report, rc, ready, h, pinned) for (report, rc, ready, _e), h,
                         (*_n, pinned) in zip(waited, held, procs, strict=True)],
               "stderr_tail": [[ln for ln in e.splitlines() if ln.strip()][-5:]
                               for *_r, e in waited if e]}
        self.results["runs"][label] = run
        self.save()
        return run

    def _wait(self, proc: subprocess.Popen, began: float) -> tuple[dict | None, object, float,
                                                                   str]:
        """A node's --json report, exit status ("timeout" past the budget), READY (its exit,
        seconds from the common start) and stderr."""
        try:
            out, err = proc.communicate(timeout=max(10.0, self.left() - 5))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            rc = "timeout"
        ready = time.monotonic() - began
        try:
            report = json.loads(out)
        except ValueError:
            report = None
        return report, rc, ready, err

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
        listing = shared.lists.kernel_list(adapter, [task_digest(t) for t in tasks])
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
        builder_jobs: int, pinned: bool = False, discovery: list[int] | None = None,
        loaded: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, budget, url)
    try:
        for model in models:
            if discovery:
                run_discovery_sweep(bench, model, discovery)
            elif pinned:
                run_pinned(bench, model, ks, loaded)
            else:
                run_shared(bench, model, ks, out, builder_jobs)
            bench.save()
    finally:
        bench.close()
    checks = [ok for r in bench.results["runs"].values() for ok in
              (r.get("checks") or {}).values()]
    checks += [b.get("identical", False) for b in bench.results["builder"].values()
               if "skipped" not in b]
    skipped = sorted(label for label, r in bench.results["runs"].items() if "skipped" in r)
    bench.results["skipped"] = skipped
    bench.results["all_checks_hold"] = all(checks) and bool(checks)
    bench.save()
    if skipped:
        bench.log(f"not run: {', '.join(skipped)}")
    bench.log(f"all checks hold: {bench.results['all_checks_hold']}")
    return 0 if bench.results["all_checks_hold"] else 1


def run_shared(bench: Bench, model: str, ks: list[int], out: Path, builder_jobs: int) -> None:
    """One node alone, then K nodes at once for each K, all on every core."""
    alone = bench.nodes(model, [None], f"{model}-alone", need=60.0)
    if alone is not None:
        alone.update(judge_run(alone, None, bench.cores))
        bench.log(f"{model} alone: {alone['wall']} s, {alone['summed_compiles']} "
                  f"compiled, {alone['distinct_entries']} entries")
    for k in ks:
        row = bench.nodes(model, [None] * k, f"{model}-k{k}", need=75.0)
        if row is None:
            continue
        row.update(judge_run(row, alone["wall"] if alone else None, bench.cores))
        bench.log(f"{model} K={k}: {row['wall']} s ({row.get('ratio_to_alone')}x alone), "
                  f"{row['summed_compiles']} compiled for {row['distinct_entries']} "
                  f"entries; checks {row['checks']}")
        if k == ks[0]:
            bench.builder(model, out / "work" / f"{model}-k{k}" / "n0" / "dg", builder_jobs)


def run_pinned(bench: Bench, model: str, ks: list[int], loaded: bool = False) -> None:
    """For each K: one node alone pinned to the first C = cores // K cores (once per C), then
    K nodes each pinned to its own C cores, at once; with loaded, then K nodes alone at once
    (run_loaded_alone)."""
    cpus = sorted(os.sched_getaffinity(0))
    alone_by_cores: dict[int, dict | None] = {}
    for k in ks:
        slices = core_slices(cpus, k)
        per_node = len(slices[0])
        if per_node not in alone_by_cores:
            alone = bench.nodes(model, [slices[0]], alone_label(model, per_node),
                                need=pinned_need(1, per_node, None))
            if alone is not None:
                alone.update(judge_run(alone, None, per_node))
                alone["checks"]["jobs_equal_pinned_cores"] = pinned_sizing_holds(
                    alone["nodes"], per_node)
                log_pinned(bench, f"{model} alone on {per_node} cores", alone)
            alone_by_cores[per_node] = alone
        alone = alone_by_cores[per_node]
        label = f"{model}-k{k}-pinned"
        if alone is None:
            bench.log(f"SKIP {label}: no node alone on {per_node} cores to compare with")
            bench.results["runs"][label] = {"skipped": f"no node alone on {per_node} cores"}
            continue
        row = bench.nodes(model, slices, label, need=pinned_need(k, per_node, alone["wall"]))
        if row is None:
            continue
        row.update(judge_run(row, None, per_node))
        plan = bench.held[alone_label(model, per_node)][0]  # the node alone's entries
        pinned = judge_pinned(row, alone["wall"], bench.held[label], plan)
        row["checks"].update(pinned.pop("checks"))
        row.update(pinned)
        log_pinned(bench, f"{model} K={k} x {per_node} cores", row)
        if loaded:
            run_loaded_alone(bench, model, slices, row, alone["wall"])


def run_loaded_alone(bench: Bench, model: str, slices: list[list[int]], row: dict,
                     alone_wall: float) -> None:
    """K nodes alone at once, node i pinned to slices[i] with its own store (none shares
    work): the node alone on a box as busy as the K run's; the K run judged against their
    mean READY too (loaded_ratio)."""
    k, per_node = len(slices), len(slices[0])
    label = f"{model}-alone-c{per_node}-x{k}"
    alone = bench.nodes(model, slices, label, need=pinned_need(1, per_node, alone_wall),
                        urls=bench.own_stores(k))
    if alone is None:
        return
    alone.update(judge_run(alone, None, per_node))
    for check in ("compiles_equal_distinct", "nvcc_runs_equal_distinct"):
        alone["checks"].pop(check)  # K nodes alone: each compiles every entry
    alone["checks"]["each_compiled_every_entry"] = all(
        n["compiled"] == alone["distinct_entries"] for n in alone["nodes"])
    alone["checks"]["jobs_equal_pinned_cores"] = pinned_sizing_holds(alone["nodes"], per_node)
    row.update(loaded_ratio(row["wall"], [n["ready"] for n in alone["nodes"]], k))
    bench.save()
    bench.log(f"{model} {k} nodes alone at once, {per_node} cores each: READY "
              f"{min(n['ready'] for n in alone['nodes'])}-"
              f"{max(n['ready'] for n in alone['nodes'])} s (mean {row['loaded_alone']} s, "
              f"quiet alone {alone_wall} s); K={k} run {row['wall']} s = "
              f"{row['ratio_to_loaded_alone_over_k']}x of their mean / K (limit "
              f"{row['limit']}); checks {alone['checks']}")


def run_discovery_sweep(bench: Bench, model: str, counts: list[int]) -> None:
    """One node alone on every core per count of discovery processes
    (WARMD_DISCOVERY_PROCESSES): how long the discovery takes, when the first kernel is
    compiled, the wall. The first run's kernels (each one's nvcc seconds and source) go to
    compile_times.json: the data an order by expected compile time is fitted on."""
    for count in counts:
        label = f"{model}-alone-d{count}"
        row = bench.nodes(model, [None], label, need=60.0,
                          extra_env={"WARMD_DISCOVERY_PROCESSES": str(count)})
        if row is None:
            continue
        row.update(judge_run(row, None, bench.cores))
        node = row["nodes"][0]
        timeline = node.get("timeline") or {}
        bench.log(f"{model} alone, {count} discovery processes asked, "
                  f"{node['discovery_processes']} ran: wall {row['wall']} s, discovery "
                  f"{node['discovery_seconds']} s, first compile "
                  f"{timeline.get('deep_gemm.first_compile')} s, {node['compiled']} compiled")
        if count == counts[0]:
            save_compile_times(bench.out, label)


def save_compile_times(out: Path, label: str) -> None:
    """compile_times.json: {entry: {"seconds": nvcc seconds, "source": kernel.cu}} of a
    run's node 0, from its report and its DeepGEMM cache root."""
    report = json.loads((out / "reports" / f"{label}-n0.json").read_text()) or {}
    seconds = {k["name"]: k["seconds"] for t in report.get("task_details", [])
               for k in t.get("kernels", []) if k.get("outcome") == "compiled"}
    held = entries(out / "work" / label / "n0" / "dg")
    rows = {}
    for name, secs in seconds.items():
        source = held.get(name, Path("/nonexistent")) / "kernel.cu"
        rows[name] = {"seconds": secs,
                      "source": source.read_text() if source.is_file() else None}
    path = out / "compile_times.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[label] = rows
    path.write_text(json.dumps(data, indent=1))


def alone_label(model: str, per_node: int) -> str:
    """The run of one node of model alone, pinned to per_node cores."""
    return f"{model}-alone-c{per_node}"


def log_pinned(bench: Bench, title: str, run: dict) -> None:
    """A pinned run's lines: wall, ratio against its limit, READY spread, each node, checks."""
    line = f"{title}: wall {run['wall']} s"
    if "ratio_to_alone_over_k" in run:
        limit = run["limit"]
        verdict = ("no limit set" if limit is None else
                   "PASS" if run["checks"]["within_limit"] else "FAIL")
        line += (f", {run['ratio_to_alone_over_k']}x of alone / K ({run['ideal']} s; limit "
                 f"{limit}: {verdict}), READY spread {run['ready_spread']} of the wall "
                 f"(limit {run['spread_limit']}: "
                 f"{'PASS' if run['checks']['ready_spread_within_limit'] else 'FAIL'})")
    bench.log(f"{line}; {run['summed_compiles']} compiled for {run['distinct_entries']} "
              "entries")
    for i, n in enumerate(run["nodes"]):
        bench.log(f"  node {i}: READY {n['ready']} s, rc {n['rc']}, {n['cores']} cores, "
                  f"{n['jobs']} jobs, {n['discovery_processes']} discovery processes, "
                  f"compiled {n['compiled']}, installed {n['installed']}, discovery "
                  f"{n['discovery_seconds']} s, kernel list {n['kernel_list']!r}, process "
                  f"start {n['process_start']} s, outside its report {n['outside_report']} s")
    failed = [name for name, ok in run["checks"].items() if not ok]
    bench.log(f"  checks: {'all hold' if not failed else 'FAILED ' + ', '.join(failed)}")


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
    parser.add_argument("--pinned", action="store_true",
                        help="K machines of cores // K cores: each node pinned to its own "
                             "cores, against one node alone on as many")
    parser.add_argument("--loaded", action="store_true",
                        help="with --pinned: also K nodes alone at once, each on its own "
                             "cores and store, as a baseline on an equally busy box")
    parser.add_argument("--discovery", default="",
                        help="counts of discovery processes (1,2,4,8): one node alone on "
                             "every core per count, instead of the K runs")
    opts = parser.parse_args(argv)
    try:
        models, ks = parse_models(opts.models), parse_nodes(opts.nodes)
        discovery = parse_counts(opts.discovery) if opts.discovery else []
        if opts.loaded and not opts.pinned:
            raise ValueError("--loaded goes with --pinned")
        if opts.pinned:
            for k in ks:
                core_slices(sorted(os.sched_getaffinity(0)), k)
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
        return run(opts.out, opts.budget, models, ks, url, opts.builder_jobs,
                   opts.pinned, discovery, opts.loaded)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
