"""An interrupted `warmd warmup` (a real FlashInfer sm_90a build stopped while nvcc runs):
the progress, the summary and its counters say the same thing (the task was interrupted,
not failed, and is counted nowhere), and the module's directory is left as it was before
the build: no build.ninja, no lock file, no half-made module."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS

pytestmark = pytest.mark.slow  # a real FlashInfer build

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_an_interrupted_build_is_reported_as_interrupted_and_leaves_nothing(tmp_path):
    workspace = tmp_path / "ws"
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80",
           "FLASHINFER_WORKSPACE_BASE": str(workspace), "WARMD_REDIS_URL": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ops = workspace / ".cache" / "flashinfer"
    deadline = time.monotonic() + 120
    while not list(ops.rglob("silu_and_mul/build.ninja")):  # FlashInfer is building it
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)  # ninja has started nvcc
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "warmup: interrupted: flashinfer silu_and_mul" in err
    assert "FAILED" not in out + err and "failed flashinfer" not in err
    assert "0/1 tasks" in out and "(interrupted)" in out
    assert re.search(r"^Tasks +0$", out, re.M)  # the interrupted task is counted nowhere
    assert re.findall(r"^  failed +(\d+)", out, re.M) == ["0", "0"]  # tasks, kernels
    left = _files(workspace)
    assert not any(name.endswith(("build.ninja", ".lock", ".so", ".o")) for name in left), left
    assert not any("/silu_and_mul/" in name for name in left), left
