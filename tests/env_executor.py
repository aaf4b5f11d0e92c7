"""A stand-in for a library's compiler in a warmup worker (tests/capture/test_capture_rederive.py):
its executor starts a child process, as nvcc or ninja is started, and reports the names of
the variables that child was given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from warmd.executors.base import Executor, TaskResult


class EnvExecutor(Executor):
    library = "flashinfer"  # stands in for the library whose compiler it plays

    def cache(self):
        raise NotImplementedError

    def check(self) -> tuple[bool, str]:
        return True, "ok"

    def run(self, task) -> TaskResult:
        done = subprocess.run([sys.executable, "-c",
                               "import json, os; print(json.dumps(dict(os.environ)))"],
                              capture_output=True, text=True, timeout=60)
        Path(task.kernel).write_text(done.stdout)
        return TaskResult(task.key, self.library, True, 0.0, [], json.dumps(done.returncode))
