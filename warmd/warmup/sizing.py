"""How much of this node a warmup uses: its GPUs, its compile jobs, its worker processes."""

from __future__ import annotations

import os

from warmd.warmup.options import WarmupOptions

GPU_WORKERS_PER_GPU = 4  # processes sharing one GPU (each holds a CUDA context and inputs)
GIB_PER_COMPILE = 2  # memory one nvcc or ninja job may take


def _local_gpus(visible: tuple[str, ...] | None):
    from warmd.targets import detect_local_gpus

    return detect_local_gpus(visible)


def gpu_ids(options: WarmupOptions) -> list[str]:
    """The GPUs the workers share out: the options', else the ones visible to the node's
    context."""
    if options.gpu_ids is not None:
        return list(options.gpu_ids)
    visible = options.context.visible_gpu_ids
    total = sum(g.count for g in _local_gpus(visible))
    if visible is not None:
        return list(visible[:total])
    return [str(i) for i in range(total)]


def default_workers(gpus: int, cpus: int | None = None,
                    memory_bytes: int | None = None) -> int:
    """Compile jobs at once on this node: one per core (nvcc and ninja are CPU-bound), at
    most one per GIB_PER_COMPILE of memory, at least one per GPU."""
    if cpus is None:
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    memory_bytes = memory_bytes or _memory_bytes()
    by_memory = max(1, memory_bytes // (GIB_PER_COMPILE << 30)) if memory_bytes else cpus
    return max(1, gpus, min(cpus, by_memory))


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def worker_count(jobs: int, cold: int, gpus: int) -> int:
    """Worker processes for a run: one per cold task (a verified task needs none, and
    each worker's ninja gets jobs // count of the cores), at most one per compile job and
    GPU_WORKERS_PER_GPU per GPU."""
    count = max(1, min(jobs, cold))
    return min(count, GPU_WORKERS_PER_GPU * gpus) if gpus else count
