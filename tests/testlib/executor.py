"""testlib's executor: runs in warmup's worker process, compiling a task's entries into the
root warmup gave it (WARMD_TESTLIB_DIR) unless they are already there."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from testlib import ROOT_ENV
from testlib.cache import DEFAULT_SIZE, DirAdapter, compile_entry
from warmd.executors.base import Executor, KernelOutcome, TaskResult
from warmd.tasks import Task


class TestlibExecutor(Executor):
    library = "testlib"

    def __init__(self) -> None:
        self._adapter = DirAdapter(Path(os.environ[ROOT_ENV]))

    def cache(self) -> DirAdapter:
        return self._adapter

    def check(self) -> tuple[bool, str]:
        return True, ""

    def run(self, task: Task) -> TaskResult:
        """spec: entries (names), size (bytes each), seconds (each compile takes), log (a
        file every compile is logged to), say (a line printed, as a compiler's chatter)."""
        spec = task.spec
        if spec.get("say"):
            print(spec["say"])
        log = Path(spec["log"]) if spec.get("log") else None
        began = time.monotonic()
        present = {e.name for e in self._adapter.list_entries()}
        kernels = []
        for name in spec["entries"]:
            if name in present:
                kernels.append(KernelOutcome(name, "local_hit"))
                continue
            start = time.monotonic()
            compile_entry(self._adapter, name, spec.get("size", DEFAULT_SIZE), log,
                          spec.get("seconds", 0.0))
            kernels.append(KernelOutcome(name, "compiled", time.monotonic() - start))
        return TaskResult(task.key, task.library, True, time.monotonic() - began, kernels)


def task_kernels(task: Task) -> tuple[tuple[str, Task], ...]:
    """Each entry of a task, with the task that builds only that entry (its plugin's
    ``task_kernels``: each is then one unit of cluster work)."""
    return tuple((name, dataclasses.replace(task, key=f"{task.key}#{name}",
                                            spec={**task.spec, "entries": [name]}))
                 for name in task.spec["entries"])
