"""A run's record of what happened to each kernel, appended to as it happens (from the
claim loops' threads, the fetches and the tasks' workers), and the one function that reads
outcomes from it (``derive``): each task's kernels, each kernel's one outcome on this node,
and each unit of cluster work (what the boot report and a stage's discovery report count).
Nothing is relabelled afterwards: an outcome is what the events before it say.

The events of a kernel (or of a unit of cluster work: a task unit's task key, a slice):

    CLAIMED    a claim loop builds it here next (its claim held, or taken without one)
    WAITED     a claim loop found it held by another node (the first time)
    TOOK_OVER  its claimer died, or held it past the wait limit: built here without its claim
    BUILT      a claim loop built it here (seconds: what building it took)
    INSTALLED  installed from another node: by a claim loop (a unit), or by the store's
               fetch in this run (no unit: the entries the store wrote, verified)
    FAILED     a claim loop's build of it failed (error)
    COMPILED   a kernel stage's compiler built it here in this run (seconds: nvcc's)
    NAMED      a task's report names it: what the task's own run said of it, or nothing
               (a task built through its units: what its unit did says it)

A task's kernel is counted:
    a failure        as its task's run or its unit said;
    a remote hit     when found here and the store installed it in this run, or its unit
                     was installed from another node;
    compiled         when its task's run compiled it, or its unit was built here, or (with
                     a kernel stage) the stage compiled it; a kernel built once on the
                     node (by a unit or a stage) is counted compiled by the first task
                     naming it, a hit by the others;
    a local hit      otherwise.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from warmd.coordination import BootReport, WorkKind
from warmd.executors.base import KernelOutcome
from warmd.stats import Outcome


class KernelEvent(enum.StrEnum):
    """What happened to a kernel (or a unit of cluster work) in a run; see the module."""

    CLAIMED = "claimed"
    WAITED = "waited"
    TOOK_OVER = "took_over"
    BUILT = "built"
    INSTALLED = "installed"
    FAILED = "failed"
    COMPILED = "compiled"
    NAMED = "named"


# what ends a unit of cluster work here
_UNIT_ENDS = frozenset({KernelEvent.BUILT, KernelEvent.INSTALLED, KernelEvent.FAILED})


@dataclass(frozen=True)
class Event:
    kind: KernelEvent
    library: str
    name: str  # the kernel (cache entry); of a unit: a task unit's task key, a slice's digest
    unit: WorkKind | None = None  # the claim loop's unit; None: no unit of cluster work
    seconds: float = 0.0  # BUILT, FAILED, COMPILED: what building it took here
    error: str = ""  # FAILED
    task: str = ""  # NAMED: the task naming it
    outcome: Outcome | None = None  # NAMED: what the task's own run said; None: its unit says
    staged: bool = False  # NAMED: its library has a kernel stage (each kernel built once)
    naming: int = 0  # NAMED: which naming (one call of RunEvents.name) it is of
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Naming:
    """What a task's report says of one kernel, as it names it."""

    name: str
    outcome: Outcome | None = None  # None: what the kernel's unit did says it
    seconds: float = 0.0


@dataclass(frozen=True)
class UnitDone:
    """What became of one unit of cluster work here."""

    library: str
    kind: WorkKind
    name: str
    got: KernelEvent  # BUILT, INSTALLED or FAILED
    seconds: float = 0.0
    waited: float = 0.0  # seconds between first finding it held and having it
    took_over: bool = False
    error: str = ""


@dataclass
class Derived:
    """What a run's events say so far (``derive``); ``seen``: how many events it read."""

    seen: int = 0
    namings: dict[int, list[KernelOutcome]] = field(default_factory=dict)
    kernels: dict[tuple[str, str], Outcome] = field(default_factory=dict)  # (library, name)
    units: dict[tuple[str, WorkKind, str], UnitDone] = field(default_factory=dict)
    # what the outcomes are read from
    installed: set[tuple[str, str]] = field(default_factory=set)  # by the store's fetches
    compiled: dict[tuple[str, str], float] = field(default_factory=dict)  # by a stage
    counted: set[tuple[str, str]] = field(default_factory=set)  # counted compiled by a task
    waiting: dict[tuple[str, WorkKind, str], float] = field(default_factory=dict)
    taken: set[tuple[str, WorkKind, str]] = field(default_factory=set)

    def of(self, libraries: Iterable[str], kinds: Iterable[WorkKind]) -> list[UnitDone]:
        """The units of these libraries and kinds done here, in the order they were."""
        libraries, kinds = set(libraries), set(kinds)
        return [u for u in self.units.values() if u.library in libraries and u.kind in kinds]

    def unit(self, library: str, kind: WorkKind, name: str) -> UnitDone | None:
        return self.units.get((library, kind, name))


def derive(events: list[Event], start: Derived | None = None) -> Derived:
    """What the events say, read in order (from where ``start`` left off: the same as
    reading them all again)."""
    derived = start if start is not None else Derived()
    for event in events[derived.seen:]:
        _read(derived, event)
    derived.seen = len(events)
    return derived


def _read(derived: Derived, event: Event) -> None:
    kernel = (event.library, event.name)
    if event.unit is not None:
        _read_unit(derived, event)
    elif event.kind is KernelEvent.INSTALLED:
        derived.installed.add(kernel)
    elif event.kind is KernelEvent.COMPILED:
        derived.compiled.setdefault(kernel, event.seconds)
    elif event.kind is KernelEvent.NAMED:
        outcome = _outcome(derived, event)
        derived.namings.setdefault(event.naming, []).append(outcome)
        derived.kernels[kernel] = _kernel(derived.kernels.get(kernel), outcome.outcome)


def _read_unit(derived: Derived, event: Event) -> None:
    assert event.unit is not None
    key = (event.library, event.unit, event.name)
    if event.kind is KernelEvent.WAITED:
        derived.waiting.setdefault(key, event.at)
    elif event.kind is KernelEvent.TOOK_OVER:
        derived.taken.add(key)
    elif event.kind in _UNIT_ENDS:
        since = derived.waiting.get(key)
        waited = 0.0 if since is None else round(event.at - since, 3)
        derived.units[key] = UnitDone(event.library, event.unit, event.name, event.kind,
                                      event.seconds, waited, key in derived.taken, event.error)


# a unit's last event -> (its kernel's outcome, whether its build seconds count, counted once)
_BY_UNIT = {KernelEvent.BUILT: (Outcome.COMPILED, True, True),
            KernelEvent.INSTALLED: (Outcome.REMOTE_HIT, False, False),
            KernelEvent.FAILED: (Outcome.FAILED, True, False)}


def _outcome(derived: Derived, named: Event) -> KernelOutcome:
    """The outcome of a kernel as its task names it, from the events before the naming."""
    kernel = (named.library, named.name)
    outcome, seconds, once = named.outcome, named.seconds, named.staged
    if outcome is None:  # what its unit did (none: it was here before the run's units)
        unit = derived.unit(named.library, WorkKind.ENTRY, named.name)
        got = unit.got if unit is not None else None
        outcome, its_seconds, once = _BY_UNIT.get(got, (Outcome.LOCAL_HIT, False, False))
        seconds = unit.seconds if its_seconds and unit is not None else 0.0
    if outcome == Outcome.LOCAL_HIT and kernel in derived.installed:
        outcome = Outcome.REMOTE_HIT
    if outcome == Outcome.LOCAL_HIT and named.staged and kernel in derived.compiled:
        outcome = Outcome.COMPILED
    if outcome == Outcome.COMPILED and once:
        if kernel in derived.counted:
            return KernelOutcome(named.name, Outcome.LOCAL_HIT, 0.0)
        derived.counted.add(kernel)
        if named.staged and kernel in derived.compiled:
            seconds = derived.compiled[kernel]
    return KernelOutcome(named.name, outcome, seconds)


_RANK = {Outcome.LOCAL_HIT: 0, Outcome.FAILED: 1, Outcome.REMOTE_HIT: 2, Outcome.COMPILED: 3}


def _kernel(before: Outcome | None, now: Outcome) -> Outcome:
    """A kernel's one outcome on the node, over every task naming it: compiled by one of
    them, else installed from another node, else failed, else a local hit."""
    return now if before is None or _RANK[now] > _RANK[before] else before


def boot(units: list[UnitDone], timeline: dict[str, float | None]) -> BootReport:
    """What these units of cluster work say of this node's share of the cluster's work."""
    report = BootReport(timeline=timeline)
    for unit in units:
        report.compiled += unit.got is KernelEvent.BUILT
        report.installed += unit.got is KernelEvent.INSTALLED
        report.failed += unit.got is KernelEvent.FAILED
        report.waited += unit.waited > 0 or unit.took_over
        report.took_over += unit.took_over
        report.wait_seconds += unit.waited
    return report


class RunEvents:
    """One run's events, appended to from any thread; what they say so far (``derived``)."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._derived = Derived()  # what name() read so far
        self._compiled: set[tuple[str, str]] = set()  # kernels a COMPILED event is of
        self._namings = 0
        self._lock = threading.Lock()

    def add(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def derived(self) -> Derived:
        """What the events say so far (read afresh: the caller's own)."""
        return derive(self.events())

    def installed(self, library: str) -> frozenset[str]:
        """The library's entries the store's fetches installed in this run."""
        with self._lock:
            derived = derive(self._events, self._derived)
            return frozenset(name for lib, name in derived.installed if lib == library)

    def compiled(self, library: str, name: str, seconds: float) -> None:
        """A kernel stage says it compiled this kernel in this run (once is enough)."""
        with self._lock:
            if (library, name) not in self._compiled:
                self._compiled.add((library, name))
                self._events.append(Event(KernelEvent.COMPILED, library, name,
                                          seconds=seconds))

    def name(self, task: str, library: str, names: list[Naming],
             staged: bool = False) -> list[KernelOutcome]:
        """A task names these kernels: their outcomes, from the events so far."""
        with self._lock:
            self._namings += 1
            naming = self._namings
            self._events.extend(Event(KernelEvent.NAMED, library, n.name, task=task,
                                      outcome=n.outcome, seconds=n.seconds, staged=staged,
                                      naming=naming) for n in names)
            derived = derive(self._events, self._derived)
            return [replace(k) for k in derived.namings.get(naming, [])]  # the caller's own
