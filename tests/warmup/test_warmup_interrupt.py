"""An interrupted `warmd warmup` (a real FlashInfer sm_90a build stopped while nvcc runs):
the progress, the summary and its counters say the same thing (the task was interrupted,
not failed, and is counted nowhere), the module's directory is left as it was before the
build (no build.ninja, no lock file, no half-made module), and nothing of the stopped nvcc
is left in the temp dir (it writes its intermediate files there and, killed, leaves them)."""

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
    workspace, temp = tmp_path / "ws", tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80",
           "FLASHINFER_WORKSPACE_BASE": str(workspace), "WARMD_REDIS_URL": "off",
           "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(temp.rglob("tmpxft_*silu_and_mul*")):  # nvcc is compiling the module
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
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
    assert _files(temp) == [] and list(temp.iterdir()) == []
