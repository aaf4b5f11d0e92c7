"""Warmup speed on one GPU node (issue 12), every ratio measured in this one run. Run by
scripts/bench/device_speed.sh on the H200; results in docs/benchmarks.md.

    python scripts/bench/speed_bench.py run --out DIR [--budget SECONDS] [--models qwen,dsv3]

Steps (each a fresh process timed from outside, each cold one with a fresh
DG_JIT_CACHE_DIR; skipped when the budget left is below what it needs):

  <m>-default   cold, default workers, publishing to warmd's embedded store (node A)
  floor         nvcc alone on the plan's own kernels: one at a time, one wave of one per
                core, then every kernel source from a queue, one nvcc per core (the exact
                command DeepGEMM runs, from the kernel stage's report)
  <m>-remote    node B: empty cache, same store; must compile nothing, start no worker and
                never import torch
  <m>-local     node A again without the store (local-disk hits), same checks
  <m>-sweep     coverage: a fresh process runs DeepGEMM itself (no shim) over every M of
                every task on node B's cache; must compile nothing
  <m>-numeric   node B's kernels compute what torch computes (dense GEMMs, several M)
  <m>-w8, -w1   cold with --workers 8 and --workers 1
  <m>-replay    warm with --verify-load (the library loads every kernel), for comparison
  keys          a plain per-task DeepGEMM build (no shim) and a kernel-stage build of the
                same small plan name exactly the same entries

`probe` runs warmd's CLI in this process and records which modules it imported:

    python scripts/bench/speed_bench.py probe REPORT.json -- warmup ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speed_checks import check_cold, check_warm, nvcc_floor, stage_of
from step_runner import BenchRun, run_step

ROOT = Path(__file__).resolve().parents[2]
PLANS = {
    "qwen": ["--model", "qwen3-30b-a3b-fp8"],
    "dsv3": ["--model", "deepseek-v3", "--tp", "8"],
}
WATCHED = ("torch", "deep_gemm", "flashinfer", "tvm_ffi")


# ----- probe: the CLI in this process, then what it imported -----

def probe(report: Path, argv: list[str]) -> int:
    from warmd.cli import main

    code = 0
    try:
        main(argv, prog_name="warmd")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # recorded, not hidden
        code = 1
        print(f"probe: {type(exc).__name__}: {exc}", file=sys.stderr)
    report.write_text(json.dumps({"rc": code, "imported": {m: m in sys.modules
                                                           for m in WATCHED},
                                  "modules": len(sys.modules)}))
    return code


# ----- the benchmark -----

def entries(root: Path) -> set[str]:
    try:
        return {p.name for p in (root / "cache").iterdir() if p.is_dir()}
    except OSError:
        return set()


class Bench(BenchRun):
    RESULTS_FILE = "speed.json"

    def __init__(self, out: Path, work: Path, budget: float, max_tokens: int) -> None:
        self.cores = len(os.sched_getaffinity(0))
        super().__init__(out, budget, {"budget_s": budget, "max_tokens": max_tokens,
                                       "cores": self.cores, "steps": {}, "checks": {}})
        self.work = work
        self.plan_args = ["--max-tokens", str(max_tokens), "--mode", "relax",
                          "--library", "deep_gemm"]

    def check(self, name: str, ok: bool, detail) -> None:
        self.results["checks"][name] = {"ok": bool(ok), "detail": detail}
        self.log(f"CHECK {name}: {'ok' if ok else 'FAILED'} {detail}")
        self.save()

    def env(self, cache: Path, node: str) -> dict:
        # One state dir for every step: it locates the embedded store they share.
        return {**os.environ, "DG_JIT_CACHE_DIR": str(cache), "WARMD_NODE_NAME": node,
                "WARMD_STATE_DIR": str(self.work / "state")}

    def skip(self, name: str, need: float) -> bool:
        if self.left() >= need:
            return False
        self.log(f"SKIP {name}: {self.left():.0f}s left, needs ~{need:.0f}s")
        self.results["steps"][name] = {"skipped": f"needs ~{need:.0f}s"}
        self.save()
        return True

    def run(self, name: str, argv: list[str], env: dict, need: float,
            cache: Path | None = None) -> dict | None:
        """One step in a fresh process; its stdout is parsed as JSON when it is."""
        if self.skip(name, need):
            return None
        before = entries(cache) if cache else set()
        self.log(f"RUN  {name}: {' '.join(argv[1:])}")
        began = time.monotonic()
        rc, printed = run_step(argv, env, max(10.0, self.left() - 5), 3000, 15)
        row: dict = {"argv": argv[1:], "rc": rc, "wall_s": round(time.monotonic() - began, 3)}
        if cache is not None:
            after = entries(cache)
            row.update(cache=str(cache), entries_before=len(before), entries_after=len(after),
                       new_entries=len(after - before))
        row.update(printed)
        self.results["steps"][name] = row
        self.save()
        self.log(f"DONE {name}: rc={rc} wall={row['wall_s']}s {_brief(row)}")
        if rc != 0:
            for line in row["stderr_tail"]:
                print(f"       | {line[:300]}", flush=True)
        return row

    def warmup(self, name: str, model: str, cache: Path, node: str, need: float,
               *extra: str, probed: bool = False) -> dict | None:
        argv = ["warmup", *PLANS[model], *self.plan_args, *extra, "--json"]
        if not probed:
            return self.run(name, [sys.executable, "-m", "warmd", *argv],
                            self.env(cache, node), need, cache)
        report = self.work / f"{name}.probe.json"
        row = self.run(name, [sys.executable, __file__, "probe", str(report), "--", *argv],
                       self.env(cache, node), need, cache)
        if row is not None and report.exists():
            row["probe"] = json.loads(report.read_text())
            self.save()
        return row


def _brief(row: dict) -> str:
    data = row.get("json")
    if not isinstance(data, dict):
        return f"new_entries={row.get('new_entries')}"
    stages = data.get("kernel_stages") or [{}]
    return (f"kernels={data.get('kernels')} modes={data.get('hits_by_mode')} "
            f"workers={data.get('workers_started')} nvcc_runs={stages[0].get('nvcc_runs')} "
            f"new_entries={row.get('new_entries')}")


def numeric(bench: Bench, model: str, cache: Path) -> None:
    """node B's installed kernels against torch: dense GEMMs of the plan at several M."""
    code = """
import json, sys, torch, deep_gemm
from deep_gemm.utils.math import per_token_cast_to_fp8, per_block_cast_to_fp8
plan = json.loads(sys.stdin.read())
rows = []
for task in [t for t in plan["tasks"] if t["kernel"] == "fp8_gemm_nt"][:2]:
    n, k = task["n"], task["k"]
    for m in sorted(set([min(task["m"]), 64, 1000, max(task["m"])])):
        a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((n, k), device="cuda", dtype=torch.bfloat16)
        d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        deep_gemm.fp8_gemm_nt(per_token_cast_to_fp8(a, use_ue8m0=False),
                              per_block_cast_to_fp8(b, use_ue8m0=False), d)
        ref = a.float() @ b.float().t()
        x, y = d.double(), ref.double()
        diff = float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
        rows.append({"n": n, "k": k, "m": m, "diff": diff})
print(json.dumps(rows))
"""
    name = f"{model}-numeric"
    if bench.skip(name, 25):
        return
    plan = subprocess.run([sys.executable, "-m", "warmd", "plan", *PLANS[model],
                           *bench.plan_args[:4], "--with", "deep_gemm", "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    before = entries(cache)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], input=plan.stdout, text=True,
                          capture_output=True, env=bench.env(cache, "numeric"), cwd=ROOT)
    try:
        rows = json.loads(proc.stdout)
    except ValueError:
        rows = None
    new = entries(cache) - before
    bench.results["steps"][name] = {"rc": proc.returncode, "rows": rows,
                                    "wall_s": round(time.monotonic() - began, 3),
                                    "new_entries": len(new),
                                    "stderr_tail": proc.stderr.splitlines()[-8:]}
    worst = max((r["diff"] for r in rows), default=None) if rows else None
    bench.check(f"{name}: installed kernels match torch (diff < 1e-3), none compiled",
                rows is not None and worst is not None and worst < 1e-3 and not new,
                {"worst_diff": worst, "gemms": len(rows or []), "new_entries": len(new)})


def bench_model(bench: Bench, model: str, big: bool) -> None:
    work = bench.work
    a, b = work / f"{model}-a", work / f"{model}-b"
    cold = bench.warmup(f"{model}-default", model, a, "a", 60 if big else 90)
    check_cold(bench, f"{model}-default", cold)
    if cold is None:
        return
    floor = nvcc_floor(bench, cold) if model == "qwen" else None
    if floor:
        bench.check(f"{model}-default within 1.5x of the nvcc floor of one kernel",
                    cold["wall_s"] <= 1.5 * floor["floor_s"],
                    {"default_wall_s": cold["wall_s"], "floor_s": floor["floor_s"],
                     "wave_floor_s": floor["wave_floor_s"],
                     "ratio": round(cold["wall_s"] / floor["floor_s"], 3)})
        timeline = stage_of(cold).get("timeline") or {}
        bench.results["checks"].setdefault("ratios", {}).update({
            f"{model}-default / nvcc pool of every source": round(
                cold["wall_s"] / floor["pool_s"], 3),
            f"{model} nvcc pool / floor of one kernel": round(
                floor["pool_s"] / floor["floor_s"], 3),
            f"{model}-default first kernel known at (s)": (timeline.get("kernels_known")
                                                          or [None])[0]})
    remote = bench.warmup(f"{model}-remote", model, b, "b", 20, probed=True)
    check_warm(bench, f"{model}-remote", remote, cold)
    local = bench.warmup(f"{model}-local", model, a, "a", 15, "--no-shared", probed=True)
    check_warm(bench, f"{model}-local", local, cold)
    sweep = bench.run(f"{model}-sweep", [sys.executable, "scripts/bench/deepgemm_sweep.py",
                                         *PLANS[model], *bench.plan_args[:4], "--json"],
                      bench.env(b, "sweep"), 40, b)
    if sweep is not None:
        data = sweep.get("json") or {}
        bench.check(f"{model}-sweep: every M compiles nothing on the installed cache",
                    sweep["rc"] == 0 and sweep.get("new_entries") == 0,
                    {"calls": data.get("calls"), "new_entries": sweep.get("new_entries"),
                     "failed": data.get("failed"), "seconds": data.get("seconds")})
    numeric(bench, model, b)
    if big:
        return
    w1 = bench.warmup(f"{model}-w1", model, work / f"{model}-w1", "w1", 150, "--no-shared",
                      "--workers", "1")
    check_cold(bench, f"{model}-w1", w1)
    w8 = bench.warmup(f"{model}-w8", model, work / f"{model}-w8", "w8", 60, "--no-shared",
                      "--workers", "8")
    check_cold(bench, f"{model}-w8", w8)
    if w1 is not None:
        compare_serial(bench, model, w1, {"default": cold, "w8": w8, "remote": remote,
                                          "local": local})
    bench.warmup(f"{model}-replay", model, a, "a", 20, "--no-shared", "--verify-load")


def compare_serial(bench: Bench, model: str, w1: dict, rows: dict) -> None:
    """Ratios against cold --workers 1 (a lower bound of it when it ran out of time)."""
    bound = w1["rc"] == "timeout"
    ratios = bench.results["checks"].setdefault("ratios", {})
    for name in ("default", "w8"):
        if rows[name] is not None:
            ratios[f"{model} w1 / {name}" + (" (at least)" if bound else "")] = round(
                w1["wall_s"] / rows[name]["wall_s"], 3)
    serial = stage_of(w1).get("nvcc_seconds")
    if rows["default"] is not None and serial and not bound:
        # Every distinct kernel's own nvcc time (the serial run's), spread over the cores:
        # the floor with each kernel's time measured, not one kernel's.
        floor = serial / bench.cores
        bench.check(f"{model}-default within 1.5x of the nvcc floor of every kernel",
                    rows["default"]["wall_s"] <= 1.5 * floor,
                    {"default_wall_s": rows["default"]["wall_s"],
                     "serial_nvcc_s": serial, "floor_s": round(floor, 3),
                     "ratio": round(rows["default"]["wall_s"] / floor, 3)})
    if rows["default"] is not None:
        bench.check(f"{model}-default at least 6x --workers 1",
                    w1["wall_s"] >= 6 * rows["default"]["wall_s"],
                    {"w1_s": w1["wall_s"], "default_s": rows["default"]["wall_s"],
                     "w1_cut_short": bound})
    for name in ("remote", "local"):
        if rows[name] is not None:
            share = rows[name]["wall_s"] / w1["wall_s"]
            bench.check(f"{model}-{name} <= 1% of cold --workers 1", share <= 0.01,
                        {"share": round(share, 5), "w1_cut_short": bound})


def keys_identical(bench: Bench) -> None:
    """A plain DeepGEMM build (per task, DeepGEMM runs nvcc itself) and a kernel-stage
    build of the same small plan: the same entry names."""
    small = ["--model", "qwen3-30b-a3b-fp8", "--m-list", "1,64,512,2048", "--library",
             "deep_gemm", "--no-shared", "--json"]
    plain, staged = bench.work / "keys-plain", bench.work / "keys-stage"
    rows = [bench.run("keys-plain", [sys.executable, "-m", "warmd", "warmup", *small,
                                     "--per-task", "--workers", "4"],
                      bench.env(plain, "plain"), 45, plain),
            bench.run("keys-stage", [sys.executable, "-m", "warmd", "warmup", *small],
                      bench.env(staged, "stage"), 25, staged)]
    if all(r is not None for r in rows):
        a, b = entries(plain), entries(staged)
        bench.check("keys: plain DeepGEMM build == kernel-stage build", a == b and bool(a),
                    {"plain": len(a), "stage": len(b), "only_plain": sorted(a - b)[:5],
                     "only_stage": sorted(b - a)[:5]})


def run(out: Path, budget: float, models: list[str], max_tokens: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="speed-"))
    bench = Bench(out, work, budget, max_tokens)
    server = subprocess.run([sys.executable, "-m", "warmd", "cache", "server", "start",
                             "--json"], capture_output=True, text=True, cwd=ROOT,
                            env=bench.env(work / "none", "server"))
    bench.results["server"] = {"rc": server.returncode, "stdout": server.stdout[-500:],
                               "stderr": server.stderr[-500:]}
    try:
        for index, model in enumerate(models):
            bench_model(bench, model, big=index > 0)
            if index == 0:
                keys_identical(bench)
    finally:
        subprocess.run([sys.executable, "-m", "warmd", "cache", "server", "stop"],
                       capture_output=True, cwd=ROOT, env=bench.env(work / "none", "server"))
        bench.results["total_s"] = round(time.monotonic() - bench.began, 1)
        bench.save()
    failed = [k for k, v in bench.results["checks"].items() if k != "ratios" and not v["ok"]]
    bench.log(f"checks failed: {failed}" if failed else "every check passed")
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "probe":
        rest = sys.argv[3:]
        return probe(Path(sys.argv[2]), rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=500)
    parser.add_argument("--models", default="qwen,dsv3")
    parser.add_argument("--max-tokens", type=int, default=8192)
    args = parser.parse_args()
    return run(args.out, args.budget, args.models.split(","), args.max_tokens)


if __name__ == "__main__":
    sys.exit(main())
