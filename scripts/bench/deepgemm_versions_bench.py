"""DeepGEMM as vLLM 0.34.0 ships it (2.8.1, ``vllm.third_party.deep_gemm``) and as
sgl-deep-gemm 0.1.4.post1, on one GPU node, in one run. Run by
scripts/bench/device_deepgemm_versions.sh on the H200; results in docs/benchmarks.md.

    python scripts/bench/deepgemm_versions_bench.py --out DIR --vendored PYTHONPATH \\
        --external PYTHONPATH [--budget SECONDS]

Every step is a fresh process timed from outside, each cold one with a fresh
DG_JIT_CACHE_DIR, all for the plan of one serve command (SERVE below):

  plan       `warmd plan --json` from the serve command, vendored path: DeepGEMM found as
             vllm.third_party.deep_gemm 2.8.1, DeepGEMM tasks planned
  v281       cold `warmd warmup --library deep_gemm`, default workers (kernel stage)
  v281-sweep a fresh process runs every M of every DeepGEMM task through
             vllm.third_party.deep_gemm, PDL on as vLLM 0.34.0 sets it, on v281's cache:
             must compile nothing
  v014       the same cold warmup with sgl-deep-gemm 0.1.4.post1 as the external deep_gemm
  v281-w1    the same cold warmup as v281 with --workers 1 (the serial baseline)
  v281-pattern (with --pattern also or only) a fresh process calls
             vllm.third_party.deep_gemm as vLLM 0.34.0 serves and warms up
             (scripts/bench/deepgemm_engine_pattern.py: psum layout, alignment scopes, PDL on, every
             M up to the token budget) on v281's cache: must compile nothing. With
             --pattern only the run is plan, v281 and this step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from step_runner import BenchRun, run_step

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tests/data/models/qwen3-235b-a22b-fp8"
SERVE = ["--", "vllm", "serve", MODEL, "--tensor-parallel-size", "4"]


class Bench(BenchRun):
    RESULTS_FILE = "versions.json"

    def __init__(self, out: Path, budget: float) -> None:
        super().__init__(out, budget, {"serve": " ".join(SERVE[1:]),
                                       "cores": len(os.sched_getaffinity(0)),
                                       "steps": {}, "checks": {}})
        self.work = Path("/tmp/dgv-work")

    def check(self, name: str, ok: bool, detail) -> None:
        self.results["checks"][name] = {"ok": bool(ok), "detail": detail}
        self.log(f"CHECK {name}: {'ok' if ok else 'FAILED'} {json.dumps(detail)[:400]}")
        self.save()

    def run(self, name: str, argv: list[str], pythonpath: str, cache: Path | None) -> dict:
        env = {**os.environ, "PYTHONPATH": pythonpath, "VLLM_MOE_USE_DEEP_GEMM": "1",
               "WARMD_STATE_DIR": str(self.work / f"state-{name}")}
        if cache is not None:
            env["DG_JIT_CACHE_DIR"] = str(cache)
        before = entries(cache)
        self.log(f"RUN  {name}: {' '.join(argv)}")
        began = time.monotonic()
        rc, printed = run_step([sys.executable, *argv], env, max(10.0, self.left() - 5), 2000,
                               12)
        row: dict = {"argv": argv, "pythonpath": pythonpath, "rc": rc,
                     "wall_s": round(time.monotonic() - began, 2)}
        if cache is not None:
            after = entries(cache)
            row.update(cache=str(cache), new_entries=len(after - before))
        row.update(printed)
        self.results["steps"][name] = row
        self.save()
        self.log(f"DONE {name}: rc={rc} wall={row['wall_s']}s new_entries="
                 f"{row.get('new_entries')}")
        if rc != 0:
            for line in row["stderr_tail"]:
                print(f"       | {line[:300]}", flush=True)
        return row

    def warmup(self, name: str, pythonpath: str, *extra: str) -> dict:
        argv = ["-m", "warmd", "warmup", "--library", "deep_gemm", "--no-shared", "--json",
                *extra, *SERVE]
        return self.run(name, argv, pythonpath, self.work / name)


def entries(root: Path | None) -> set[str]:
    try:
        return {p.name for p in (root / "cache").iterdir() if p.is_dir()} if root else set()
    except OSError:
        return set()


def stage_of(row: dict) -> dict:
    stages = (row.get("json") or {}).get("kernel_stages") or []
    return stages[0] if stages else {}


def check_cold(bench: Bench, name: str, row: dict) -> None:
    data, stage = row.get("json") or {}, stage_of(row)
    kernels = data.get("kernels") or {}
    bench.check(f"{name}: ok", row["rc"] == 0 and not data.get("tasks_failed"),
                {"rc": row["rc"], "tasks_failed": data.get("tasks_failed")})
    bench.check(f"{name}: fast path", stage.get("fast_path") is True
                and (stage.get("discovered_kernels") or 0) > 0,
                {k: stage.get(k) for k in ("deep_gemm", "fast_path", "fast_path_off",
                                           "discovered_kernels", "discovery_seconds")})
    bench.check(f"{name}: compiles == distinct entries",
                stage.get("nvcc_runs") == row.get("new_entries") == kernels.get("compiled")
                == stage.get("distinct_sources") and not stage.get("nvcc_failed"),
                {"nvcc_runs": stage.get("nvcc_runs"), "new_entries": row.get("new_entries"),
                 "reported_compiled": kernels.get("compiled"),
                 "distinct_sources": stage.get("distinct_sources"),
                 "nvcc_failed": stage.get("nvcc_failed")})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vendored", required=True,
                        help="PYTHONPATH with vLLM 0.34.0's layout and no separate DeepGEMM")
    parser.add_argument("--external", required=True,
                        help="PYTHONPATH with sgl-deep-gemm 0.1.4.post1")
    parser.add_argument("--budget", type=float, default=500)
    parser.add_argument("--pattern", choices=("no", "also", "only"), default="no",
                        help="run the engine-pattern step too, or only it after a cold warmup")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.out, args.budget)

    plan = bench.run("plan", ["-m", "warmd", "plan", "--target", "h200", "--json", *SERVE],
                     args.vendored, None)
    data = plan.get("json") or {}
    probe = (data.get("libraries") or {}).get("deep_gemm") or {}
    tasks = [t["key"] for t in data.get("tasks") or [] if t["library"] == "deep_gemm"]
    bench.check("plan: finds vllm.third_party.deep_gemm 2.8.1 and plans DeepGEMM tasks",
                probe.get("module") == "vllm.third_party.deep_gemm"
                and probe.get("version") == "2.8.1" and bool(tasks),
                {"deep_gemm": probe, "engine_notes": data.get("engine_notes", [])[:1],
                 "deep_gemm_tasks": tasks})

    fast = bench.warmup("v281", args.vendored)
    check_cold(bench, "v281", fast)
    if args.pattern == "only":
        engine_pattern(bench, args.vendored)
        return finish(bench)
    sweep = bench.run("v281-sweep", ["scripts/bench/deepgemm_sweep.py", "--pdl", "--json", *SERVE],
                      args.vendored, bench.work / "v281")
    sweep_json = sweep.get("json") or {}
    bench.check("v281-sweep: every M through vllm.third_party.deep_gemm compiles nothing",
                sweep["rc"] == 0 and not sweep_json.get("new_entries")
                and not sweep_json.get("failed") and sweep.get("new_entries") == 0,
                {k: sweep_json.get(k) for k in ("module", "pdl", "tasks", "calls",
                                                "new_entries", "failed", "seconds")})
    old = bench.warmup("v014", args.external)
    check_cold(bench, "v014", old)
    bench.check("v014: sgl-deep-gemm 0.1.4.post1 was the DeepGEMM used",
                "0.1.4" in str(stage_of(old).get("deep_gemm")),
                {"deep_gemm": stage_of(old).get("deep_gemm")})
    serial = bench.warmup("v281-w1", args.vendored, "--workers", "1")
    data_w1 = serial.get("json") or {}
    bench.check("v281-w1: ok", serial["rc"] == 0 and not data_w1.get("tasks_failed"),
                {"rc": serial["rc"], "kernels": data_w1.get("kernels")})
    ratio = serial["wall_s"] / fast["wall_s"] if fast.get("wall_s") else None
    bench.check("v281: default at least 6x faster than --workers 1",
                ratio is not None and ratio >= 6,
                {"default_s": fast.get("wall_s"), "workers1_s": serial.get("wall_s"),
                 "ratio": round(ratio, 2) if ratio else None})
    if args.pattern == "also":
        engine_pattern(bench, args.vendored)
    return finish(bench)


def engine_pattern(bench: Bench, pythonpath: str) -> None:
    """vLLM 0.34.0's own DeepGEMM calls after warmd's cold warmup: no new entry."""
    row = bench.run("v281-pattern", ["scripts/bench/deepgemm_engine_pattern.py", "--json", *SERVE],
                    pythonpath, bench.work / "v281")
    data = row.get("json") or {}
    bench.check("v281-pattern: vLLM 0.34.0's serving and warmup calls compile nothing",
                row["rc"] == 0 and row.get("new_entries") == 0 and not data.get("new_entries")
                and not data.get("failed_count"),
                {k: data.get(k) for k in ("module", "version", "pdl", "calls", "new_entries",
                                          "failed_count", "failed", "seconds")})
    bench.results["pattern"] = data.get("pattern")
    bench.save()


def finish(bench: Bench) -> int:
    bench.results["total_s"] = round(time.monotonic() - bench.began, 1)
    bench.save()
    failed = [n for n, c in bench.results["checks"].items() if not c["ok"]]
    bench.log(f"{len(bench.results['checks']) - len(failed)} checks ok, failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
