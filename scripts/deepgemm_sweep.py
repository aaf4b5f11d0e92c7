"""Coverage check for a DeepGEMM warmup: run every M that each DeepGEMM task of the plan
serves (dense: every M from the task's smallest to its largest; grouped: every row count,
a multiple of 128, in that range) and count the kernels that compiles. After a complete
warmup of the same plan the answer must be zero.

    python scripts/deepgemm_sweep.py --model deepseek-v3 --tp 8 --max-tokens 4096 --json

Needs a GPU with DeepGEMM; compiles into the engine's DG_JIT_CACHE_DIR like `warmd warmup`.
Exit code 0 when nothing compiled and nothing failed, 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import click

from warmd.cli.options import plan_options
from warmd.executors.deep_gemm import DeepGemmExecutor
from warmd.mvalues import GROUPED_BLOCK_M
from warmd.plan import PlanRequest, Task, make_plan


def sweep_task(task: Task) -> Task:
    """The same task over every M in its range, not just the warmup's sample."""
    lo, hi = min(task.m), max(task.m)
    step = GROUPED_BLOCK_M if task.num_groups else 1
    return dataclasses.replace(task, m=tuple(range(lo, hi + 1, step)))


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def main(request: PlanRequest, as_json: bool) -> None:
    plan = make_plan(request)
    tasks = [sweep_task(t) for t in plan.tasks if t.library == "deep_gemm"]
    executor = DeepGemmExecutor()
    ok, reason = executor.check()
    if not ok:
        click.echo(f"deepgemm_sweep: cannot run DeepGEMM here: {reason}", err=True)
        sys.exit(1)
    adapter = executor.cache()
    before = {e.name for e in adapter.list_entries()}
    started = time.monotonic()
    rows = []
    for task in tasks:
        result = executor.run(task)
        compiled = [k.name for k in result.kernels if k.outcome == "compiled"]
        rows.append({"task": task.key, "m_range": [min(task.m), max(task.m)],
                     "calls": len(task.m), "ok": result.ok, "error": result.error,
                     "compiled": compiled, "seconds": result.seconds})
        if not as_json:
            click.echo(f"{task.key}: M {min(task.m)}..{max(task.m)} ({len(task.m)} calls) "
                       f"compiled={len(compiled)} {result.seconds:.1f}s"
                       + (f" FAILED: {result.error}" if not result.ok else ""))
    after = {e.name for e in adapter.list_entries()}
    summary = {
        "tasks": len(tasks), "calls": executor.calls,
        "entries_before": len(before), "entries_after": len(after),
        "new_entries": sorted(after - before),
        "compiled": sum(len(r["compiled"]) for r in rows),
        "failed": sum(not r["ok"] for r in rows),
        "seconds": round(time.monotonic() - started, 2),
        "cache_dir": str(adapter.root), "per_task": rows,
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"{summary['calls']} calls, {len(summary['new_entries'])} new cache entries, "
                   f"{summary['failed']} failed, {summary['seconds']}s")
    sys.exit(0 if not summary["new_entries"] and not summary["failed"] else 1)


if __name__ == "__main__":
    main()
