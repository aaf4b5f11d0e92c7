"""What a warmup is asked to do: which tasks, how many compile jobs, which cache roots."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from warmd.context import NodeContext
from warmd.errors import WarmdInputError
from warmd.plan import Plan
from warmd.tasks import Task


@dataclass
class WarmupOptions:
    libraries: tuple[str, ...] = ()  # empty: every library of the plan
    task_filter: str | None = None  # regex searched in task keys
    workers: int | None = None  # compile jobs at once; None: sizing.default_workers()
    gpu_ids: tuple[str, ...] | None = None  # None: the visible GPUs
    # library -> the cache root its workers compile into; missing: the one the plan's engine
    # reads (Plan.dirs(); for_plan fills them in)
    cache_roots: dict[str, Path] = field(default_factory=dict)
    # the longest another node's claim is waited on (None: the context's)
    single_flight_timeout: float | None = None
    # the longest one task (a discovery piece, an nvcc run) runs before it is killed and
    # fails (None: the context's)
    task_timeout: float | None = None
    verify_load: bool = False  # replay warm tasks through the library (loads every kernel)
    kernel_split: bool = True  # let libraries split cold tasks below the task
    warm_only: bool = False  # finish only if no task needs a library; else run nothing
    # a node without a GPU building for the plan's target: its caches describe that GPU,
    # and a library that needs a GPU to run its tasks builds only what a kernel list names
    builder: bool = False
    # the node's settings (cache roots, GPUs, store): its top builds it once; default: this
    # process's environment
    context: NodeContext = field(default_factory=NodeContext.of)

    def __post_init__(self) -> None:
        self.cache_roots = {name: Path(root) for name, root in self.cache_roots.items()}
        if self.single_flight_timeout is None:
            self.single_flight_timeout = self.context.store.single_flight_timeout
        if self.task_timeout is None:
            self.task_timeout = self.context.task_timeout

    def for_plan(self, plan: Plan) -> WarmupOptions:
        """These options with every library's cache root: the one given, else the one the
        plan's engine reads (a library no engine rule covers: the context's setting)."""
        from warmd.libraries import LIBRARIES  # the registry loads every library's kernels

        dirs = plan.dirs()
        roots = {name: dirs.root(lib.root.env) or lib.root.default(self.context.environ)
                 for name, lib in LIBRARIES.items()}
        return replace(self, cache_roots={**roots, **self.cache_roots})

    def select(self, tasks: tuple[Task, ...]) -> list[Task]:
        try:
            pattern = re.compile(self.task_filter) if self.task_filter else None
        except re.error as exc:
            raise WarmdInputError(f"invalid --task-filter regex {self.task_filter!r}: "
                                  f"{exc}") from None
        return [t for t in tasks
                if (not self.libraries or t.library in self.libraries)
                and (pattern is None or pattern.search(t.key))]
