"""The same warmups on two warmd trees, in one run: a refactor must leave compiles, hits
and time as they were (cold, warm from the store, warm from disk).

    python scripts/bench/bench_before_after.py --tree before=PATH --tree after=PATH --out DIR \
        [--model qwen3-30b-a3b-fp8] [--max-tokens 8192] [--engine-version 0.30.0] [--rounds 1]

For each round and each tree, in the order given (each a fresh process timed from outside,
each tree with its own embedded store, started by that tree's own `warmd cache server`):

  cold    node A, empty DG_JIT_CACHE_DIR, default workers, publishing to the store
  remote  node B, empty cache, same store: everything from the store
  local   node A again, --no-shared: everything from its own disk

The engine version is pinned so that both trees plan the same tasks when their engine rules
differ (a tree that follows a newer engine plans what that engine compiles); each step
records the plan key, and only runs of the same plan key compare.

Results: DIR/before_after.json (every step's wall time, kernels as the tree counts them and
each kernel once by the same rule for both trees (`distinct`), workers, new entries) and
one line per step on stdout. Needs a GPU and DeepGEMM for the DeepGEMM plans it runs.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from warmd.executors.base import KernelOutcome, TaskResult  # noqa: E402
from warmd.tasks import Task  # noqa: E402
from warmd.warmup.report import TaskReport, count  # noqa: E402

STEPS = ("cold", "remote", "local")


def entries(root: Path) -> set[str]:
    try:
        return {p.name for p in (root / "cache").iterdir()
                if p.is_dir() and not p.name.startswith(".")}  # not the installs' staging
    except OSError:
        return set()


def warmd(tree: Path, argv: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    environ = {**env, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        proc = subprocess.run([sys.executable, "-m", "warmd", *argv], cwd=tree, env=environ,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "", "timeout"
    return proc.returncode, proc.stdout, proc.stderr


def step_row(name: str, rc: int, wall: float, stdout: str, stderr: str,
             new_entries: int) -> dict:
    row: dict = {"step": name, "rc": rc, "wall_s": round(wall, 3), "new_entries": new_entries}
    try:
        data = json.loads(stdout)
    except ValueError:
        row["stderr_tail"] = stderr.splitlines()[-8:]
        return row
    row.update(plan_key=data.get("plan_key"), tasks=data.get("tasks"),
               kernels=data.get("kernels"), workers=data.get("workers_started"),
               hits_by_mode=data.get("hits_by_mode"), tasks_failed=data.get("tasks_failed"),
               distinct=distinct_outcomes(data.get("task_details") or []))
    return row


def distinct_outcomes(details: list[dict]) -> dict:
    """A report's kernels counted from its task details by this checkout's rule (each kernel
    once: warmd.warmup.report.count), so that both trees are read the same way whatever
    their own counters: {"total", "local_hits", "remote_hits", "compiled", "failed"}."""
    reports = [TaskReport(Task(d.get("library", ""), "", key=d["key"]),
                          TaskResult(d["key"], d.get("library", ""), bool(d.get("ok")), 0.0,
                                     [KernelOutcome(k["name"], k["outcome"])
                                      for k in d.get("kernels", [])]))
               for d in details]
    return count(reports).kernel_counts()


def run_tree(label: str, tree: Path, plan_args: list[str], work: Path) -> list[dict]:
    state = work / f"{label}-state"
    base = {**os.environ, "WARMD_STATE_DIR": str(state)}
    rc, out, err = warmd(tree, ["cache", "server", "start", "--json"], base, 60)
    if rc != 0:
        return [{"step": "server", "rc": rc, "stderr_tail": err.splitlines()[-8:]}]
    plan = ["warmup", *plan_args, "--library", "deep_gemm", "--json"]
    rows = []
    try:
        for step in STEPS:
            node = "b" if step == "remote" else "a"
            cache = work / f"{label}-{node}"
            env = {**base, "DG_JIT_CACHE_DIR": str(cache), "WARMD_NODE_NAME": node}
            argv = plan + (["--no-shared"] if step == "local" else [])
            before = entries(cache)
            began = time.monotonic()
            rc, out, err = warmd(tree, argv, env, 400)
            row = step_row(step, rc, time.monotonic() - began, out, err,
                           len(entries(cache) - before))
            rows.append(row)
            print(f"{label:>8} {step:<7} rc={rc} wall={row['wall_s']:7.2f}s "
                  f"plan={row.get('plan_key')} "
                  f"kernels={row.get('kernels')} distinct={row.get('distinct')} "
                  f"workers={row.get('workers')} "
                  f"new_entries={row['new_entries']}", flush=True)
    finally:
        warmd(tree, ["cache", "server", "stop"], base, 60)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="qwen3-30b-a3b-fp8")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--engine-version", default="0.30.0")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    trees = []
    for item in args.tree:
        label, sep, path = item.partition("=")
        if not sep or not Path(path, "warmd").is_dir():
            parser.error(f"--tree {item!r}: expected LABEL=PATH of a warmd checkout")
        trees.append((label, Path(path).resolve()))
    args.out.mkdir(parents=True, exist_ok=True)
    plan_args = ["--model", args.model, "--max-tokens", str(args.max_tokens), "--mode", "relax",
                 "--engine-version", args.engine_version]
    results: dict = {"plan_args": plan_args, "runs": []}
    work = Path(tempfile.mkdtemp(prefix="before-after-"))
    try:
        for round_ in range(args.rounds):
            for label, tree in trees:
                run_work = work / f"r{round_}"
                run_work.mkdir(exist_ok=True)
                results["runs"].append({"round": round_, "tree": label, "steps": run_tree(
                    label, tree, plan_args, run_work)})
                (args.out / "before_after.json").write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
