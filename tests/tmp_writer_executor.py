"""A stand-in for a compiler's use of $TMPDIR in a warmup worker
(tests/executors/test_worker_scratch.py): each task writes an intermediate file into the
worker's temp dir and starts a child (as ninja starts nvcc) that goes on writing there,
then reports that dir and the child's pid. A task whose module is "die" then kills its own
worker process, as a crashing library would; one whose module is "hang" never ends, as a
hung compiler would (after writing its child's pid to <its temp dir>/../hung-child); one
whose module is "caches" reports where torch inductor would keep its cache in this worker,
and CUTE_DSL_CACHE_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from env_executor import EnvExecutor

from warmd.executors.base import TaskResult

# bounded: a stray one (a failing test) ends by itself
WRITER = ("import os, sys, time\n"
          "for _ in range(1200):\n"
          "    open(os.path.join(sys.argv[1], f'tmpxft_{os.getpid()}'), 'a').write('x')\n"
          "    time.sleep(0.05)\n")


def own_temp_dir(tmp_path: Path, monkeypatch) -> Path:
    """The system's temp dir, as the calling test's own (its fixture's body), the sweep of
    gone pools' directories to run again in it."""
    from warmd.executors import scratch

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    scratch._remove_orphans.cache_clear()
    return folder


class TmpWriterExecutor(EnvExecutor):
    """EnvExecutor's stand-in library and check; its own run."""

    def run(self, task) -> TaskResult:
        if task.module == "caches":
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            said = {"inductor": cache_dir(), "cute_dsl": os.environ.get("CUTE_DSL_CACHE_DIR")}
            return TaskResult(task.key, self.library, True, 0.0, [], json.dumps(said))
        scratch = tempfile.gettempdir()
        Path(scratch, "kernel.cpp1.ii").write_text("// intermediate\n")
        child = subprocess.Popen([sys.executable, "-c", WRITER, scratch])
        if task.module == "die":
            os._exit(3)
        if task.module == "hang":
            Path(scratch).parent.joinpath("hung-child").write_text(str(child.pid))
            time.sleep(600)
        said = {"tmpdir": scratch, "child": child.pid}
        return TaskResult(task.key, self.library, True, 0.0, [], json.dumps(said))
