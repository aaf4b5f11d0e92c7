"""Executors run a plan's tasks for one library and say what the library actually did."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from warmd.cache.base import CacheAdapter
from warmd.plan import Task
from warmd.stats import Outcome

OUTCOMES = tuple(Outcome)


@dataclass
class KernelOutcome:
    """One kernel (cache entry) a task touched, and how it was obtained."""

    name: str
    outcome: Outcome  # a library may pass its value ("compiled"): read as the Outcome
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)


@dataclass
class TaskResult:
    task_key: str
    library: str
    ok: bool
    seconds: float
    kernels: list[KernelOutcome] = field(default_factory=list)
    error: str | None = None


class Executor(ABC):
    library: str

    @abstractmethod
    def cache(self) -> CacheAdapter:
        """The local cache adapter whose root this executor compiles into."""

    @abstractmethod
    def check(self) -> tuple[bool, str]:
        """Whether this executor can run here (library importable, GPU or nvcc present)."""

    @abstractmethod
    def run(self, task: Task) -> TaskResult:
        """Run one task; failures are returned in the result, never raised."""


class KernelStage(Protocol):
    """Compiles a library's cold tasks below the task, before and while its workers run
    them: each distinct kernel once on the node, as many at once as ``jobs`` allows. Made
    as ``Stage(cache root, cold tasks, jobs, GPU ids, worker environment)``; the workers
    still run every task through the library, which then finds (or waits for) what the
    stage compiled, so what is counted is still what the library did."""

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str]) -> None: ...

    def start(self) -> dict[str, str]:
        """Start in the background; the environment the library's workers need meanwhile."""

    def hold_workers(self) -> None:
        """Block until the library's workers may start (the stage's own start-up done)."""

    def compile_seconds(self, entry: str) -> float | None:
        """What compiling this entry took, when the stage compiled it."""

    def stop(self) -> None:
        """Stop now (Ctrl-C): its compilers end, nothing half written is left."""

    def finish(self) -> dict:
        """Wait for it, clean up, and say what it did (for the report)."""
