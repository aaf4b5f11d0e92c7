"""The worker processes of a run and their environments: every library's cache root, what
the cold tasks' libraries need set before they are imported, a GPU each, and the kernel
stages that compile below the task while the workers run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from warmd.errors import WarmdInputError
from warmd.executors.pool import Worker
from warmd.tasks import Task
from warmd.warmup.options import WarmupOptions
from warmd.warmup.sizing import default_workers, gpu_ids, worker_count
from warmd.warmup.stage_work import StageWork
from warmd.warmup.state import RunState

if TYPE_CHECKING:  # the type only: the worker side of a run reads tasks, not the planner
    from warmd.plan import Plan

log = logging.getLogger(__name__)


def worker_env(plan: Plan, options: WarmupOptions, libraries: set[str]) -> dict[str, str]:
    """The node's variables (its context's), every cache variable as the plan's engine
    holds it, every library's cache root, and what the libraries of these tasks need set
    before they are imported (FlashInfer: its arch, a stub libcuda...)."""
    from warmd.libraries import LIBRARIES

    env = {**options.context.child_env(), **plan.dirs().child_env()}
    for name, registered in LIBRARIES.items():
        root = options.cache_roots[name]
        env[registered.root.env] = str(root)
        if name in libraries:
            env.update(registered.plugin().worker_env(plan.env.target.arch, root))
    return env


def gpu_env(env: dict[str, str], ids: list[str], index: int) -> dict[str, str]:
    """The environment of worker ``index``: one GPU of ``ids`` each, in turn."""
    if not ids:
        return env
    return {**env, "CUDA_VISIBLE_DEVICES": ids[index % len(ids)]}


def start_workers(run: RunState, cold: list[Task]) -> list[Worker]:
    """The workers for the run (their processes start on their first task), after starting
    the kernel stages of the cold tasks' libraries. Without cold tasks: one worker, which
    starts only should a verified task turn out otherwise, and no GPU lookup."""
    if not cold:
        return [Worker(lambda: worker_env(run.plan, run.options, set()),
                       timeout=run.options.task_timeout)]
    options = run.options
    ids = gpu_ids(options)
    jobs = options.workers or default_workers(len(ids))
    count = worker_count(jobs, len(cold), len(ids))
    libraries = set(run.libraries)
    extra = _start_stages(run, cold, jobs, ids) if options.kernel_split else {}
    per_build = str(max(1, jobs // count))
    shared_env: list[dict[str, str]] = []  # worked out once, when the first worker starts
    lock = threading.Lock()

    def env_for(index: int) -> Callable[[], dict[str, str]]:
        def make() -> dict[str, str]:
            for stage in run.stages():
                stage.hold_workers()  # until its compiles need no more CPU than they have
            with lock:
                if not shared_env:
                    env = {**worker_env(run.plan, options, libraries), **extra}
                    if not options.context.is_set("MAX_JOBS"):
                        env["MAX_JOBS"] = per_build  # ninja's own -j, sharing the cores
                    shared_env.append(env)
            return gpu_env(shared_env[0], ids, index)
        return make

    return [Worker(env_for(i), timeout=options.task_timeout) for i in range(count)]


def _start_stages(run: RunState, cold: list[Task], jobs: int, ids: list[str]
                  ) -> dict[str, str]:
    """Start the kernel stage of each library that has one; the environment its library's
    workers need while it runs."""
    from warmd.libraries import LIBRARIES

    extra: dict[str, str] = {}
    for library in sorted({t.library for t in cold}):
        registered = LIBRARIES.get(library)
        adapter = run.libraries[library].adapter
        if registered is None or adapter is None:
            continue
        plugin = registered.plugin()
        if not plugin.stages_kernels:
            continue
        tasks = [t for t in cold if t.library == library]
        base = worker_env(run.plan, run.options, {library})
        cluster = (StageWork(run, run.libraries[library], run.options.builder)
                   if run.shared is not None else None)
        try:
            stage = plugin.kernel_stage(adapter.root, tasks, jobs, ids, base, cluster,
                                        run.options.task_timeout)
            extra.update(stage.start())
        except WarmdInputError:
            raise  # a setting of the user's is wrong: said in one line, not worked around
        except Exception as exc:  # the tasks then compile per task, as without a stage
            log.warning("%s kernel stage did not start: %s", library, exc)
            continue
        run.libraries[library].stage = stage
    return extra
