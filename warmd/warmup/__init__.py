"""Run a plan's JIT tasks locally, sharing results through the cluster cache when given one.

Per task (warmd/warmup/task.py): a task whose every entry is here and verified (installed
from the shared cache in this run, or complete on disk with this node's record of the task
and its digests, warmd.cache.records) finishes without a library: no worker process starts
and no torch is imported (mode "verified"); ``verify_load`` replays it through the library
instead. Otherwise ``shared.entries.fetch_task`` installs what the cluster already has; on a miss,
``shared.claims.single_flight`` lets one node compile while the others wait and fetch; the task
then runs through its library's executor (in a worker process), so what is counted is what
the library did (mode "library"); a task that succeeded where the cluster had no record is
published. Kernels are counted per entry: compiled, local hit, remote hit (installed from
the shared cache in this run), or failed.

A library may split its cold tasks below the task (its plugin's ``kernel_stage``): DeepGEMM
finds the distinct kernels a plan needs and compiles each once, on every core.

The parts, in the order a run meets them:

    options.py    WarmupOptions: which tasks, how many jobs, which cache roots
    scheduler.py  run_warmup: prefetch, check each task once, start workers, hand out tasks
    state.py      what the run knows: one TaskState per task, one LibraryState per library
    task.py       one task's steps: check, fetch, flight, compile, finish, record, publish
    events.py     the run's events (claimed, built, installed, waited, failed, named...)
                  and the one reading of them: each kernel's outcome, the boot report
    workers.py    worker processes, their environments, the kernel stages
    sizing.py     GPUs, compile jobs and worker processes of this node
    report.py     TaskReport, WarmupReport, their counters, the store's health
"""

from __future__ import annotations

from warmd.warmup.options import WarmupOptions
from warmd.warmup.report import Build, Mode, StoreHealth, TaskReport, WarmupReport, store_health
from warmd.warmup.scheduler import Progress, Started, estimate, run_warmup
from warmd.warmup.sizing import GIB_PER_COMPILE, default_workers, gpu_ids, worker_count

__all__ = ["GIB_PER_COMPILE", "Build", "Mode", "Progress", "Started", "StoreHealth", "TaskReport",
           "WarmupOptions", "WarmupReport", "default_workers", "estimate", "gpu_ids", "run_warmup",
           "store_health", "worker_count"]
