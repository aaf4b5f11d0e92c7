"""What the planner's tests read of a plan: one layer's kernel selection and the reasons it
gives for the kernels it rejected, its MoE experts and FlashInfer modules; how they plan a
serve command or its equivalent flags over the published configs in tests/data/models, or
run `warmd plan --json`; and how they check that the CLI refuses a serve command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from warmd.cli import main
from warmd.engines.launch import launch_request
from warmd.kernels.selection import Selection
from warmd.plan import Plan, PlanRequest, make_plan

MODELS = Path(__file__).parent / "data" / "models"
BASE = PlanRequest(model="", target="h200", with_libs=("deep_gemm", "flashinfer", "nvcc"),
                   without_libs=("sgl_kernel",), engine_env=())


def model(name: str) -> str:
    return str(MODELS / name)


def from_command(command: str, **base) -> object:
    paths = {k.replace("-", "_").replace(".", "_"): model(k) for k in os.listdir(MODELS)}
    request = launch_request(command.format(**paths), PlanRequest(**{**BASE.__dict__, **base}))
    return make_plan(request)


def from_flags(name: str, **flags) -> object:
    return make_plan(PlanRequest(**{**BASE.__dict__, "model": model(name), **flags}))


def selection(plan: Plan, layer: str) -> Selection:
    return next(s for s in plan.selections if s.layer.name == layer)


def rejections(sel: Selection) -> dict[str, str]:
    """Each rejected kernel's name -> the reason it was rejected."""
    return {r.kernel: r.reason for r in sel.rejected}


def experts(plan):
    return selection(plan, "mlp.experts.w13")


def modules(plan) -> set[str]:
    return {t.module for t in plan.tasks if t.module}


def picked(plan: Plan, layer: str, kernel: str) -> dict[str, str]:
    """Asserts that the plan runs `kernel` for `layer`; the reasons of the kernels it rejected."""
    sel = selection(plan, layer)
    assert sel.kernel is not None and sel.kernel.name == kernel, \
        f"{layer} runs {sel.kernel and sel.kernel.name}, not {kernel}"
    return rejections(sel)


def plan_json(*args: str) -> dict:
    """`warmd plan --json <args>`'s plan, in this process."""
    result = CliRunner().invoke(main, ["plan", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # notes go to stderr


def assert_refused_in_one_line(tmp_path: Path, command: str, serve: list[str],
                               message: str) -> None:
    """`warmd <command> --target h200 -- <serve>` exits 2 with one line of error naming
    `message`, prints nothing and writes no state (HOME and the state directory under
    tmp_path)."""
    result = subprocess.run([sys.executable, "-m", "warmd", command, "--target", "h200", "--",
                             *serve], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"),
                                 "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == "" and not (tmp_path / "state").exists()
