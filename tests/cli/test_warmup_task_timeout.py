"""`warmd warmup --task-timeout`: a real FlashInfer sm_90a build still running after the
timeout is killed with its compilers and fails with that reason (exit 1), leaving no
half-made module and nothing in the temp dir; a timeout the flag cannot be is refused in one
line (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS

pytestmark = pytest.mark.slow  # a real FlashInfer build, cut short

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]
ROOT = Path(__file__).resolve().parents[2]


def _warmup(tmp_path, *args: str) -> subprocess.CompletedProcess:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"), "TMPDIR": str(temp),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "WARMD_REDIS_URL": "off"}
    return subprocess.run([sys.executable, "-m", "warmd", "warmup", *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_build_past_the_task_timeout_is_killed_and_fails_with_the_reason(tmp_path):
    done = _warmup(tmp_path, *PLAN_ARGS, "--task-timeout", "3", "--json")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["tasks_failed"] == 1
    [task] = report["task_details"]
    assert not task["ok"] and task["error"].startswith("timed out after 3 s"), task
    assert [k["outcome"] for k in task["kernels"]] == ["failed"]
    ws = tmp_path / "ws"
    left = [str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file()]
    assert not any(n.endswith((".so", ".o", "build.ninja", ".lock")) for n in left), left
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_task_timeout_that_is_not_a_positive_number_is_refused(tmp_path, value):
    done = _warmup(tmp_path, *PLAN_ARGS, "--task-timeout", value)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "--task-timeout" in done.stderr and "Traceback" not in done.stderr, lines


def test_the_task_timeout_holds_for_the_models_of_a_config_too(tmp_path):
    """--from-config takes the flag over the config's and the environment's settings (the
    embedded default config warms one FlashInfer module)."""
    done = _warmup(tmp_path, "--from-config", "warmd/examples/warmd.yaml", "--no-shared",
                   "--task-timeout", "2", "--json")
    assert done.returncode == 1, done.stderr[-3000:]
    [model] = json.loads(done.stdout)["models"]
    [failure] = model["failures"]
    assert failure["error"].startswith("timed out after 2 s"), model
    assert list((tmp_path / "tmp").iterdir()) == []
