"""A stand-in executor for tests of stopping workers (tests/executors/test_worker_stop.py):
its worker process takes EXIT_SECONDS to exit, as one holding a CUDA context does, and
writes when its exit began and ended to <WARMD_TEST_EXIT_DIR>/<pid>.json."""

from __future__ import annotations

import json
import os
import time
from multiprocessing import util
from pathlib import Path

from warmd.executors.base import Executor, TaskResult

EXIT_SECONDS = 1.0


def _slow_exit(folder: str) -> None:
    began = time.time()
    time.sleep(EXIT_SECONDS)
    Path(folder, f"{os.getpid()}.json").write_text(json.dumps([began, time.time()]))


class SlowExitExecutor(Executor):
    library = "deep_gemm"  # stands in for a library whose workers hold a GPU

    def cache(self):
        raise NotImplementedError

    def check(self) -> tuple[bool, str]:
        # multiprocessing runs its finalizers as the worker process exits
        util.Finalize(None, _slow_exit, args=(os.environ["WARMD_TEST_EXIT_DIR"],),
                      exitpriority=0)
        return True, ""

    def run(self, task) -> TaskResult:
        return TaskResult(task.key, self.library, True, 0.0, [])
