"""What the planner's tests read of a plan: one layer's kernel selection and the reasons it
gives for the kernels it rejected; and how they check that the CLI refuses a serve command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from warmd.kernels.selection import Selection
from warmd.plan import Plan


def selection(plan: Plan, layer: str) -> Selection:
    return next(s for s in plan.selections if s.layer.name == layer)


def rejections(sel: Selection) -> dict[str, str]:
    """Each rejected kernel's name -> the reason it was rejected."""
    return {r.kernel: r.reason for r in sel.rejected}


def picked(plan: Plan, layer: str, kernel: str) -> dict[str, str]:
    """Asserts that the plan runs `kernel` for `layer`; the reasons of the kernels it rejected."""
    sel = selection(plan, layer)
    assert sel.kernel is not None and sel.kernel.name == kernel, \
        f"{layer} runs {sel.kernel and sel.kernel.name}, not {kernel}"
    return rejections(sel)


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
