"""Executors run a plan's tasks for one library and say what the library actually did."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from warmd.cache.base import CacheAdapter
from warmd.plan import Task

OUTCOMES = ("local_hit", "remote_hit", "compiled", "failed")


@dataclass
class KernelOutcome:
    """One kernel (cache entry) a task touched, and how it was obtained."""

    name: str
    outcome: str  # one of OUTCOMES
    seconds: float = 0.0


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
