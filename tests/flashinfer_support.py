"""The plan the FlashInfer warmup tests build from: Qwen3-30B-A3B FP8 for SGLang on an H200,
FlashInfer its only JIT library (sgl-kernel left out). Its act_and_mul task is FlashInfer's
silu_and_mul module, which nvcc builds without a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmd.plan import Plan, PlanRequest, make_plan
from warmd.warmup import WarmupOptions, run_warmup
from warmd.warmup.report import WarmupReport

# PlanRequest's arguments, as a test hands them to another process (JSON)
FLASHINFER_PLAN = dict(model="qwen3-30b-a3b-fp8", target="h200", engine="sglang",
                       with_libs=("flashinfer",), without_libs=("sgl_kernel",))
# the same plan as `warmd plan` / `warmd warmup` arguments
FLASHINFER_PLAN_ARGS = ["-m", "qwen3-30b-a3b-fp8", "-t", "h200", "--engine", "sglang", "--with",
                        "flashinfer", "--without", "sgl_kernel"]


def flashinfer_plan() -> Plan:
    return make_plan(PlanRequest(**FLASHINFER_PLAN))


def warm_act_and_mul(plan: Plan, workspace: Path) -> WarmupReport:
    """A real warmup of the plan's act_and_mul task into a FlashInfer workspace."""
    return run_warmup(plan, WarmupOptions(libraries=("flashinfer",), task_filter="act_and_mul",
                                          cache_roots={"flashinfer": workspace}))


@contextlib.contextmanager
def act_and_mul_built(base: Path, workspace: Path) -> Iterator[tuple[Plan, WarmupReport]]:
    """The plan, its act_and_mul task warmed into workspace, warmd's state under base; both
    hold until the block ends (a module-scoped fixture's tests run inside it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WARMD_STATE_DIR", str(base / "state"))
        plan = flashinfer_plan()
        yield plan, warm_act_and_mul(plan, workspace)
