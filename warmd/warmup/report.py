"""What a warmup reports: per task (TaskReport), per run (WarmupReport, its counters; its
share of the cluster's work is what the run's events say: warmd.warmup.events.boot), and the
shared cache's health as every report gives it (store_health)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from warmd.coordination import BootReport
from warmd.executors.base import KernelOutcome, StageReport, TaskResult
from warmd.stats import BY_OUTCOME, CounterFlag, Counters, Outcome, compile_seconds_saved, ids
from warmd.tasks import Task

if TYPE_CHECKING:  # the interface only: warming without a store imports no store client
    from warmd.store.api import SharedCache

# what warmup reports from the store's counters
STORE_COUNTERS = ids(CounterFlag.RUN | CounterFlag.STORE)


class Mode(enum.StrEnum):
    """How a task's hits were counted; the value is its JSON."""

    VERIFIED = "verified"  # from entries verified here alone: no library ran
    LIBRARY = "library"  # by running its library


@dataclass
class StoreHealth:
    """The shared cache as a run found it: every report says it the same way (the URL
    without credentials; the reason says what failed and why)."""

    ok: bool = True
    reason: str = ""
    url: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Build:
    """A unit of work this node has begun or ended building (a kernel of a library, or a
    whole task when its entries are not known before it runs): what a live display shows."""

    name: str  # the entry's name, or the task's key
    library: str
    task: Task | None = None  # the task, when the unit is one


@dataclass
class TaskReport:
    task: Task
    result: TaskResult
    fetched: list[str] = field(default_factory=list)
    published: bool = False
    recorded: dict[str, float] = field(default_factory=dict)  # compile seconds on record
    own: frozenset[str] = frozenset()  # entries this node compiled itself, on record
    mode: Mode = Mode.LIBRARY

    def to_json(self) -> dict:
        return {"key": self.task.key, "library": self.task.library, "ok": self.result.ok,
                "seconds": round(self.result.seconds, 3), "error": self.result.error,
                "fetched": self.fetched, "published": self.published, "mode": self.mode,
                "kernels": [{"name": k.name, "outcome": k.outcome,
                             "seconds": round(k.seconds, 3)} for k in self.result.kernels]}


@dataclass
class WarmupReport:
    plan_key: str
    selected: int
    reports: list[TaskReport]
    counters: Counters
    seconds: float
    interrupted: bool = False
    shared: bool = False
    store: StoreHealth | None = None  # None: no shared cache
    store_counts: dict = field(default_factory=dict)  # the shared cache's own counters
    workers: int = 0  # worker processes started
    stages: list[StageReport] = field(default_factory=list)  # what kernel stages did
    not_warm: list[str] = field(default_factory=list)  # warm_only: tasks left to a library
    boot: BootReport | None = None  # the cluster's work done here (None: no shared cache)
    # wall seconds of each phase of the run, in order (where a cold run's time goes)
    phases: dict[str, float] = field(default_factory=dict)

    def hits_by_mode(self) -> dict[Mode, int]:
        """Hits counted from verified entries alone, and by running the library (each
        kernel once: ``run_kernels``)."""
        counts = dict.fromkeys(Mode, 0)
        for report, kernel in run_kernels(self.reports):
            counts[report.mode] += kernel.outcome.is_hit
        return counts

    @property
    def failed(self) -> list[TaskReport]:
        return [r for r in self.reports if not r.result.ok]

    def to_json(self) -> dict:
        c = self.counters
        return {
            "plan_key": self.plan_key,
            "tasks": len(self.reports),
            "tasks_selected": self.selected,
            "tasks_failed": len(self.failed),
            "kernels": c.kernel_counts(),
            "hit_rate": round(c.hit_rate, 4),
            "seconds": round(self.seconds, 3),
            "compile_seconds": round(c.compile_seconds, 3),
            "compile_seconds_saved": round(c.compile_seconds_saved, 3),
            "hits_by_mode": self.hits_by_mode(),
            "not_warm": self.not_warm,
            "workers_started": self.workers,
            "kernel_stages": [s.to_json() for s in self.stages],
            "interrupted": self.interrupted,
            "shared": self.shared,
            "store": {**self.store.to_json(), "counters": self.store_counts}
            if self.store is not None else None,
            "cluster": self.boot.to_json() if self.boot is not None else None,
            "phases": self.phase_json(),
            "task_details": [r.to_json() for r in self.reports],
        }

    def phase_json(self) -> dict:
        """Where the run's time went: each phase's wall seconds (start: the process's own
        start before it planned, Python and warmd's imports; plan, store: opening the
        shared cache, prefetch: its reads and installs, check: this node's caches, workers:
        starting worker processes and kernel stages (a stage's own timings, its discovery
        included, are in kernel_stages), work: fetching, compiling and publishing the cold
        tasks), the rest, and the seconds the tasks themselves spent
        fetching, installing and compiling (summed over workers)."""
        c = self.counters
        phases = {k: round(v, 3) for k, v in self.phases.items()}
        total = max(self.seconds, sum(self.phases.values()))
        return {**phases, "other": round(max(0.0, total - sum(self.phases.values())), 3),
                "total": round(total, 3),
                "tasks": {"fetch": round(c.fetch_seconds, 3),
                          "install": round(c.install_seconds, 3),
                          "compile": round(c.compile_seconds, 3)}}


# Which of a kernel's outcomes in one run counts, first to last: the run compiled it, else
# installed it from the shared cache, else found it here. A second task that touches a kernel
# the run has just compiled or installed gets it from this node's cache, and that is no hit.
_OUTCOME_ORDER = (Outcome.COMPILED, Outcome.REMOTE_HIT, Outcome.LOCAL_HIT)


def run_kernels(reports: list[TaskReport]) -> list[tuple[TaskReport, KernelOutcome]]:
    """Each kernel (cache entry) the run touched, once, with the task report whose outcome
    counts for it (``_OUTCOME_ORDER``; between equals, the first task by key), then every
    failure with its task. Several tasks share a kernel (DeepGEMM's helper kernels, a
    FlashInfer module), and which of them names it can depend on which process ran which
    task; the run's counts must not: they are a function of the kernels alone."""
    kept: dict[tuple[str, str], tuple[TaskReport, KernelOutcome]] = {}
    failed = []
    for report in sorted(reports, key=lambda r: r.task.key):
        for kernel in report.result.kernels:
            if kernel.outcome == Outcome.FAILED:
                failed.append((report, kernel))
                continue
            key = (report.task.library, kernel.name)
            held = kept.get(key)
            if held is None or (_OUTCOME_ORDER.index(kernel.outcome)
                                < _OUTCOME_ORDER.index(held[1].outcome)):
                kept[key] = (report, kernel)
    return [*kept.values(), *failed]


def count(reports: list[TaskReport]) -> Counters:
    """The run's counters from its task reports, each kernel once (``run_kernels``; a hit
    of another node's compile saved what its record says the compile took; a re-hit of this
    node's own, nothing)."""
    counters = Counters(tasks=len(reports))
    for report in reports:
        counters.tasks_failed += 0 if report.result.ok else 1
        if report.mode == Mode.VERIFIED:
            counters.verify_seconds += report.result.seconds
    for report, k in run_kernels(reports):
        if k.outcome == Outcome.COMPILED:
            counters.compiled += 1
            counters.compile_seconds += k.seconds
        elif k.outcome.is_hit:
            counters.add({BY_OUTCOME[k.outcome].id: 1, "compile_seconds_saved":
                          compile_seconds_saved(k.outcome, report.recorded.get(k.name, 0.0),
                                                k.name in report.own)})
        else:
            counters.failed += 1
    return counters


def store_health(shared: SharedCache) -> StoreHealth:
    """The shared cache's health after a run."""
    if shared.disabled_reason:
        return StoreHealth(False, f"shared cache disabled: {shared.disabled_reason}")
    url = shared.display_url
    counts = shared.stats.counters
    trouble = {k: int(counts[k]) for k in ids(CounterFlag.TROUBLE) if counts.get(k)}
    if not trouble:
        return StoreHealth(True, "", url)
    what = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in trouble.items())
    unreachable = any(k in trouble for k in ids(CounterFlag.TROUBLE | CounterFlag.DOWN))
    last = shared.last_error
    why = ("unreachable" if unreachable else "refused work") + (f": {last}" if last else "")
    return StoreHealth(False, f"shared cache {url or ''} {why} ({what}); kernels were built "
                              "locally", url)


def store_counters(shared: SharedCache) -> dict:
    """What only the store can count (bytes moved, entries refused)."""
    counts = shared.stats.counters
    return {k: counts[k] for k in STORE_COUNTERS if k in counts}
