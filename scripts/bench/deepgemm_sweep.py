"""Coverage check for a DeepGEMM warmup: run every M that each DeepGEMM task of the plan
serves (dense: every M from the task's smallest to its largest; grouped: every row count,
a multiple of 128, in that range) and count the kernels that compiles. After a complete
warmup of the same plan the answer must be zero.

    python scripts/bench/deepgemm_sweep.py --model deepseek-v3 --tp 8 --max-tokens 4096 --json

With --engine-range the M values come from the engine's own rules, not from the plan's tasks:
dense GEMMs every M from 1 (32 when vLLM's FlashInfer wrapper takes M < 32) to the engine's
largest batch, grouped GEMMs every 128-row multiple up to vLLM's compute_aligned_M(min(DP x
max_num_batched_tokens, VLLM_FUSED_MOE_CHUNK_SIZE), topk, local experts, 128)
(vllm/model_executor/warmup/deep_gemm_warmup.py); the plan only names the shapes:

    python scripts/bench/deepgemm_sweep.py --engine-range --json -- vllm serve MODEL -tp 2 -dp 2 \
        --enable-expert-parallel --max-num-batched-tokens 2048

With --pdl DeepGEMM runs with programmatic dependent launch on, as vLLM 0.34.0 sets it
(``set_pdl(True)`` on SM90 and newer).

Needs a GPU with DeepGEMM, imported as the engine imports it (an external deep_gemm, else
vLLM's vllm.third_party.deep_gemm); compiles into the engine's DG_JIT_CACHE_DIR like
`warmd warmup`.
Exit code 0 when nothing compiled and nothing failed, 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import click

from warmd.cli.options import plan_options
from warmd.libraries.deep_gemm.executor import DeepGemmExecutor
from warmd.mvalues import GROUPED_BLOCK_M
from warmd.plan import PlanRequest, make_plan
from warmd.tasks import Task


def sweep_task(task: Task) -> Task:
    """The same task over every M in its range, not just the warmup's sample."""
    lo, hi = min(task.m), max(task.m)
    step = GROUPED_BLOCK_M if task.num_groups else 1
    return dataclasses.replace(task, m=tuple(range(lo, hi + 1, step)))


def engine_range_task(task: Task, plan) -> Task:
    """The task over the engine's whole M range, computed from the launch alone."""
    wrapper = "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    layers = [s for s in plan.selections if s.layer.name in task.layers]
    if task.num_groups:
        topk = max(s.layer.topk or 1 for s in layers)
        tokens = plan.mspec.moe_tokens or plan.mspec.max_tokens
        worst = tokens * topk + task.num_groups * (GROUPED_BLOCK_M - 1)
        top = -(-worst // GROUPED_BLOCK_M) * GROUPED_BLOCK_M
        return dataclasses.replace(task, m=tuple(range(GROUPED_BLOCK_M, top + 1,
                                                       GROUPED_BLOCK_M)))
    lo = 32 if any(s.kernel and s.kernel.name == wrapper for s in layers) else 1
    return dataclasses.replace(task, m=tuple(range(lo, plan.mspec.max_tokens + 1)))


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--engine-range", is_flag=True,
              help="Sweep the engine's whole M range, not each task's own range.")
@click.option("--pdl", is_flag=True, help="Turn DeepGEMM's PDL on first, as vLLM 0.34.0 does.")
def main(request: PlanRequest, as_json: bool, engine_range: bool, pdl: bool) -> None:
    plan = make_plan(request)
    tasks = [engine_range_task(t, plan) if engine_range else sweep_task(t)
             for t in plan.tasks if t.library == "deep_gemm"]
    executor = DeepGemmExecutor()
    ok, reason = executor.check()
    if not ok:
        click.echo(f"deepgemm_sweep: cannot run DeepGEMM here: {reason}", err=True)
        sys.exit(1)
    if pdl:
        executor.deep_gemm.set_pdl(True)
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
        "module": executor.deep_gemm.__name__,
        "version": getattr(executor.deep_gemm, "__version__", None), "pdl": pdl,
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
