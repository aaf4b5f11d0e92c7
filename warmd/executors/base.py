"""Executors run a plan's tasks for one library and say what the library actually did."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from warmd.cache.base import CacheAdapter
from warmd.coordination import BootReport, DiscoveryReport, KernelList
from warmd.stats import Outcome
from warmd.tasks import Task

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


class KernelRun(Protocol):
    """Kernels built or installed through the cluster's claims (warmd.warmup.claims),
    running in the background: names added as they are known, until closed."""

    def add(self, names: list[str]) -> None: ...

    def close(self) -> None: ...

    def join(self) -> BootReport:
        """Wait for every kernel; what this node did (compiled, installed, waited...)."""


class DiscoveryRun(Protocol):
    """Discovery slices claimed through the cluster (warmd.warmup.claims), running in the
    background over the stage's discovery processes."""

    def done(self) -> bool: ...

    def stop(self) -> None: ...

    def join(self) -> DiscoveryReport:
        """Wait for every slice; what this node did (discovered, read, waited...)."""


class StageCluster(Protocol):
    """What a kernel stage may ask of the cluster (given one with a shared cache): the
    kernel lists of task slices (by task digest), the slices' discovery claimed slice by
    slice, and kernels claimed one by one. ``builder``: this node has no GPU (it only
    follows lists). ``wait_limit``: the single-flight timeout."""

    builder: bool
    wait_limit: float  # seconds: the longest any claim or kernel list is waited on

    def kernel_list(self, tasks: list[str]) -> KernelList:
        """What the store holds of these task digests' kernel lists."""

    def publish_kernel_list(self, digest: str, tasks: dict[str, list[str]],
                            jobs: dict[str, dict],
                            also: dict[str, list[str]] | None = None) -> bool: ...

    def wait(self, seconds: float) -> None:
        """Up to seconds, or until a claim of the library is released."""

    def run_kernels(self, build: Callable[[str], tuple[bool, float, str]], threads: int,
                    expected: Callable[[str], float] | None = None) -> KernelRun:
        """Start claiming kernels on threads threads; build(entry) -> (ok, seconds, error)
        builds one into the cache root (then it is published). expected(entry): its
        expected build seconds; the kernels known and unclaimed are claimed longest first
        (in the order added, without)."""

    def run_discovery(self, slices: list[str],
                      discover: Callable[[str, Any], tuple[bool, float, str]],
                      take: Callable[[list[str]], set[str]],
                      contexts: list[Any]) -> DiscoveryRun:
        """Start claiming discovery slices (task digests), one thread per context (a
        discovery process): discover(digest, context) -> (ok, seconds, error) discovers a
        slice it holds and publishes its list; take(digests) takes the lists other nodes
        published and returns the digests taken."""


@dataclass
class StageClusterReport:
    """What one node did of a kernel stage's cluster work: its kernels (``boot``, whose
    timeline holds the stage's own moments too), where its kernel list came from, and its
    discovery slices (None: it discovered nothing, or had no slices to)."""

    library: str
    boot: BootReport
    kernel_list: str
    discovery: DiscoveryReport | None = None

    def to_json(self) -> dict:
        return {**self.boot.to_json(), "library": self.library,
                "kernel_list": self.kernel_list,
                "discovery": self.discovery.to_json() if self.discovery else None}


@dataclass
class StageReport:
    """What a kernel stage did: what every stage says, typed, and ``detail``, the
    library's own fields (its JSON, in its order)."""

    library: str
    workers_started: int = 0  # discovery processes started
    cluster: StageClusterReport | None = None  # None: no shared cache
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"library": self.library, **self.detail,
                "workers_started": self.workers_started,
                "cluster": self.cluster.to_json() if self.cluster else None}


class KernelStage(Protocol):
    """Compiles a library's cold tasks below the task, before and while its workers run
    them: each distinct kernel once on the node, as many at once as ``jobs`` allows. Made
    as ``Stage(cache root, cold tasks, jobs, GPU ids, worker environment)``; the workers
    still run every task through the library, which then finds (or waits for) what the
    stage compiled, so what is counted is still what the library did."""

    def __init__(self, root: Path, tasks: list[Task], jobs: int, gpu_ids: list[str],
                 env: dict[str, str], cluster: StageCluster | None = None) -> None: ...

    def start(self) -> dict[str, str]:
        """Start in the background; the environment the library's workers need meanwhile."""

    def hold_workers(self) -> None:
        """Block until the library's workers may start (the stage's own start-up done)."""

    def compile_seconds(self, entry: str) -> float | None:
        """What compiling this entry took, when the stage compiled it."""

    def task_entries(self, task_key: str) -> list[str] | None:
        """With a cluster: once its share is done, the task's entries when all are here
        (built or installed: the task needs no worker); None: run it through the library."""

    def stop(self) -> None:
        """Stop now (Ctrl-C): its compilers end, nothing half written is left."""

    def finish(self) -> StageReport:
        """Wait for it, clean up, and say what it did (for the report)."""
