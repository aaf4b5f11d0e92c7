"""DeepGEMM warmup benchmark on one GPU: cold `warmd warmup` (4 workers and 1), a dense
sweep of every M that must compile nothing, a warm `warmd warmup` in a fresh process, and
what DeepGEMM makes of DG_JIT_CACHE_DIR=A:B. Run by scripts/bench/device_deepgemm.sh; results in
docs/benchmarks.md.

    python scripts/bench/deepgemm_bench.py --out DIR [--budget SECONDS] [--steps a,b,...]

Every step runs the real CLI (or scripts/bench/deepgemm_sweep.py) in a fresh process with its own
cache root under --work, is skipped when the time left is below what it needs, and lands in
DIR/summary.json as soon as it ends (a run cut short keeps what finished).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import click
from step_runner import BenchRun, run_step

MODELS = {
    "qwen": ["--model", "qwen3-30b-a3b-fp8"],
    "dsv3": ["--model", "deepseek-v3", "--tp", "8"],
}
ROOT = Path(__file__).resolve().parents[2]


class Bench(BenchRun):
    RESULTS_FILE = "summary.json"
    STAMP_WIDTH = 7

    def __init__(self, out: Path, work: Path, budget: float, max_tokens: int) -> None:
        super().__init__(out, budget, {"budget_s": budget, "max_tokens": max_tokens,
                                       "steps": {}})
        self.work = work
        self.plan_args = ["--max-tokens", str(max_tokens), "--mode", "relax"]

    def env(self, cache: str) -> dict:
        return {**os.environ, "DG_JIT_CACHE_DIR": cache,
                "WARMD_STATE_DIR": str(self.work / "state")}

    def run(self, name: str, argv: list[str], cache: str, need: float) -> dict | None:
        """One step in a fresh process; its stdout is JSON. None when skipped."""
        if self.left() < need:
            self.log(f"SKIP {name}: {self.left():.0f}s left, needs about {need:.0f}s")
            self.results["steps"][name] = {"skipped": f"needs ~{need:.0f}s"}
            self.save()
            return None
        root = Path(cache.split(":")[0])
        before = _entries(root)
        self.log(f"RUN  {name}: {' '.join(argv)}  (DG_JIT_CACHE_DIR={cache})")
        began = time.monotonic()
        rc, printed = run_step(argv, self.env(cache), max(10.0, self.left() - 10), 2000, 12)
        wall = round(time.monotonic() - began, 2)
        after = _entries(root)
        row = {"argv": argv, "cache": cache, "rc": rc, "wall_s": wall,
               "entries_before": len(before), "entries_after": len(after),
               "new_entries": len(after - before), **printed}
        self.results["steps"][name] = row
        self.save()
        self.log(f"DONE {name}: rc={rc} wall={wall}s new_entries={row['new_entries']} "
                 f"{_brief(row.get('json'))}")
        for line in row["stderr_tail"][-6:]:
            print(f"       | {line}", flush=True)
        failed = (row.get("json") or {}).get("tasks_failed")
        if rc != 0 or failed:
            self.worker_logs(began)
        return row

    def worker_logs(self, since: float) -> None:
        """Tails of the worker logs written during a failed step (compiler output)."""
        logs = self.work / "state" / "logs"
        cutoff = time.time() - (time.monotonic() - since)
        for log in sorted(logs.glob("*.log")) if logs.exists() else []:
            if log.stat().st_mtime >= cutoff:
                lines = log.read_text(errors="replace").splitlines()[-15:]
                print(f"       --- {log.name} ---", flush=True)
                for line in lines:
                    print(f"       | {line[:300]}", flush=True)

    def warmup(self, name: str, model: str, cache: Path, workers: int, need: float,
               max_tokens: int | None = None):
        plan_args = self.plan_args if max_tokens is None else [
            "--max-tokens", str(max_tokens), "--mode", "relax"]
        argv = [sys.executable, "-m", "warmd", "warmup", *MODELS[model], *plan_args,
                "--library", "deep_gemm", "--workers", str(workers), "--no-shared", "--json"]
        return self.run(name, argv, str(cache), need)

    def sweep(self, name: str, model: str, cache: Path, need: float):
        argv = [sys.executable, "scripts/bench/deepgemm_sweep.py", *MODELS[model], *self.plan_args,
                "--json"]
        return self.run(name, argv, str(cache), need)


def _entries(root: Path) -> set[str]:
    try:
        return {p.name for p in (root / "cache").iterdir() if p.name.startswith("kernel.")}
    except FileNotFoundError:
        return set()


def _brief(data) -> str:
    if not isinstance(data, dict):
        return ""
    keep = ("tasks", "tasks_failed", "kernels", "hit_rate", "seconds", "compile_seconds",
            "calls", "compiled", "failed")
    return json.dumps({k: data[k] for k in keep if k in data})


def describe_cache(bench: Bench, root: Path) -> None:
    """What 0.1.4.post1 really writes: file names across entries, one kernel.cu of each
    kind, what the parser makes of every entry, and DeepGEMM's staging dir."""
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter

    adapter = DeepGemmCacheAdapter(root)
    entries = adapter.list_entries()
    files: dict[str, int] = {}
    kinds: dict[str, int] = {}
    unparsed = []
    samples: dict[str, str] = {}
    for entry in entries:
        for child in entry.path.iterdir():
            files[child.name] = files.get(child.name, 0) + 1
        source = adapter.source(entry)
        if source is None:
            unparsed.append(entry.name)
            continue
        kinds[f"{source.impl}/{source.gemm_type}"] = kinds.get(
            f"{source.impl}/{source.gemm_type}", 0) + 1
        samples.setdefault(entry.name.split(".")[1], entry.name)
    all_dirs = sorted(p.name for p in (root / "cache").iterdir())
    tmp = root / "tmp"
    info = {"complete_entries": len(entries), "dirs_in_cache": len(all_dirs),
            "files_in_entries": files, "kinds": kinds, "unparsed": unparsed,
            "tmp_leftovers": sorted(p.name for p in tmp.iterdir()) if tmp.exists() else None,
            "cubin_bytes": sorted((e.path / "kernel.cubin").stat().st_size for e in entries)}
    bench.results["cache_layout"] = info
    bench.save()
    shown = {k: v for k, v in info.items() if k != "cubin_bytes"}
    bench.log(f"cache layout: {json.dumps(shown)}")
    for name in samples.values():
        bench.log(f"kernel.cu of {name}:")
        print((root / "cache" / name / "kernel.cu").read_text(), flush=True)


def pack_samples(bench: Bench, root: Path) -> None:
    """The smallest dense and grouped entries, as a tarball for tests/data/deep_gemm."""
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter

    adapter = DeepGemmCacheAdapter(root)
    by_kind: dict[str, list] = {}
    for entry in adapter.list_entries():
        source = adapter.source(entry)
        kind = source.gemm_type if source else "unparsed"
        by_kind.setdefault(kind, []).append(entry)
    picked = []
    for kind, entries in sorted(by_kind.items()):
        entries.sort(key=lambda e: (e.path / "kernel.cubin").stat().st_size)
        picked += entries[:2 if kind == "Normal" else 1]
    target = bench.out / "deepgemm-entries.tar.gz"
    with tarfile.open(target, "w:gz") as tar:
        for entry in picked:
            tar.add(entry.path, arcname=f"cache/{entry.name}")
    bench.results["packed"] = {"file": target.name, "bytes": target.stat().st_size,
                               "entries": [e.name for e in picked]}
    bench.results["fingerprint"] = adapter.fingerprint_inputs()
    bench.save()
    bench.log(f"packed {len(picked)} entries ({target.stat().st_size} bytes): "
              f"{[e.name for e in picked]}")


def colon_path_check(bench: Bench, base: Path, need: float) -> None:
    """One GEMM whose kernel is in `base`, run with DG_JIT_CACHE_DIR=<fresh>:<base>: a hit
    if DeepGEMM read A:B as a lookup list, a compile into a directory literally named
    '<fresh>:<base>' if it takes the value as one path (what 0.1.4.post1 does)."""
    front = bench.work / "ab-front"
    code = ("import json, time\n"
            "from warmd.libraries.deep_gemm.executor import DeepGemmExecutor\n"
            "from warmd.tasks import Task\n"
            "task = Task('deep_gemm', 'fp8_gemm_nt', 5120, 2048, None, (64,), key='ab')\n"
            "began = time.monotonic(); r = DeepGemmExecutor().run(task)\n"
            "print(json.dumps({'ok': r.ok, 'error': r.error, 'seconds': "
            "round(time.monotonic() - began, 2), 'kernels': "
            "[[k.name, k.outcome, k.seconds] for k in r.kernels]}))\n")
    row = bench.run("colon_path", [sys.executable, "-c", code], f"{front}:{base}", need)
    if row is not None:
        literal = Path(f"{front}:{base}")
        row["literal_dir_exists"] = literal.exists()
        row["literal_entries"] = sorted(_entries(literal))
        row["front_entries"] = sorted(_entries(front))
        bench.save()
        bench.log(f"A:B check: literal dir {literal} exists={literal.exists()} "
                  f"entries={row['literal_entries']} front={row['front_entries']}")


# Each model's cold warmup with 4 workers, sweep and warm rerun: the seconds each needs.
MODEL_NEEDS = {"qwen": {"cold_w4": 60, "sweep": 25, "warm": 20},
               "dsv3": {"cold_w4": 120, "sweep": 35, "warm": 25}}
MODEL_STEPS = {f"{model}_{stage}" for model, needs in MODEL_NEEDS.items() for stage in needs}


def model_step(bench: Bench, step: str, model: str, stage: str, cache: Path,
               ok: dict[str, bool]) -> None:
    """One of a model's steps; the sweep and the warm rerun only after a good cold warmup
    (ok[model]), which also describes the cache it made."""
    need = MODEL_NEEDS[model][stage]
    if stage == "cold_w4":
        ok[model] = _fine(bench.warmup(step, model, cache, 4, need=need))
        if ok[model]:
            describe_cache(bench, cache)
    elif not ok.get(model):
        return
    elif stage == "sweep":
        bench.sweep(step, model, cache, need=need)
    else:
        bench.warmup(step, model, cache, 1, need=need)


STEPS = ("info", "qwen_cold_w4", "pack", "qwen_sweep", "qwen_warm", "dsv3_cold_w4",
         "dsv3_sweep", "dsv3_warm", "speedup_w4", "colon_path", "speedup_w1",
         "qwen_cold_w1")


@click.command()
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--work", type=click.Path(path_type=Path), default=Path("/tmp/dgbench"),
              show_default=True, help="Cache roots and warmd state.")
@click.option("--budget", type=float, default=530.0, show_default=True,
              help="Seconds this script may run; steps that no longer fit are skipped.")
@click.option("--max-tokens", type=int, default=4096, show_default=True)
@click.option("--speedup-tokens", type=int, default=1024, show_default=True,
              help="Max tokens of the smaller Qwen3 plan the speedup_w4/w1 steps warm.")
@click.option("--steps", default=",".join(STEPS), show_default=True)
def main(out: Path, work: Path, budget: float, max_tokens: int, speedup_tokens: int,
         steps: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, work, budget, max_tokens)
    wanted = [s.strip() for s in steps.split(",") if s.strip()]
    unknown = set(wanted) - set(STEPS)
    if unknown:
        raise click.BadParameter(f"unknown steps {sorted(unknown)}; known: {STEPS}")
    q4, q1, d4 = work / "qwen-w4", work / "qwen-w1", work / "dsv3-w4"
    ok = {}
    for step in wanted:
        if step == "info":
            info = subprocess.run(
                [sys.executable, "-c", "import deep_gemm, torch; print(deep_gemm.__version__,"
                 " deep_gemm.__file__, torch.__version__, torch.cuda.get_device_name(0))"],
                capture_output=True, text=True)
            nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
            bench.results["info"] = {"deep_gemm": info.stdout.strip() or info.stderr[-500:],
                                     "nvcc": nvcc.stdout.strip().splitlines()[-1:]}
            bench.log(f"info: {bench.results['info']}")
            for model in MODELS:
                plan = subprocess.run([sys.executable, "-m", "warmd", "plan", *MODELS[model],
                                       *bench.plan_args, "--json"], capture_output=True,
                                      text=True, cwd=ROOT, env=bench.env(str(work / "none")))
                try:
                    tasks = [t for t in json.loads(plan.stdout)["tasks"]
                             if t["library"] == "deep_gemm"]
                except ValueError:
                    bench.log(f"plan {model} failed: {plan.stderr[-800:]}")
                    continue
                rows = [(t["key"], len(t["m"]), min(t["m"]), max(t["m"])) for t in tasks]
                bench.results.setdefault("plans", {})[model] = rows
                bench.log(f"plan {model}: {len(rows)} DeepGEMM tasks: {rows}")
            bench.save()
        elif step in MODEL_STEPS:
            model, stage = step.split("_", 1)
            cache = {"qwen": q4, "dsv3": d4}[model]
            model_step(bench, step, model, stage, cache, ok)
        elif step == "pack" and ok.get("qwen"):
            pack_samples(bench, q4)
        elif step == "speedup_w4":
            ok["speedup"] = _fine(bench.warmup(step, "qwen", work / "speedup-w4", 4, need=40,
                                               max_tokens=speedup_tokens))
        elif step == "colon_path" and ok.get("speedup"):
            colon_path_check(bench, work / "speedup-w4", need=20)
        elif step == "speedup_w1" and ok.get("speedup"):
            fast = bench.results["steps"]["speedup_w4"]["wall_s"]
            bench.warmup(step, "qwen", work / "speedup-w1", 1, need=3.5 * fast,
                         max_tokens=speedup_tokens)
        elif step == "qwen_cold_w1":
            cold = bench.results["steps"].get("qwen_cold_w4", {})
            need = 3.5 * cold["wall_s"] if "wall_s" in cold else 120
            bench.warmup(step, "qwen", q1, 1, need=need)
    bench.log("finished")


def _fine(row: dict | None) -> bool:
    return bool(row) and row.get("rc") == 0


if __name__ == "__main__":
    main()
