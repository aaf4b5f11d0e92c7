"""The unit of cluster work is the kernel: each one claimed cluster-wide before it is
compiled, published the moment it is built, and installed by every other node as soon as
it lands.

A ``ClaimLoop`` runs one node's share. Its compile threads (one per worker process, or
per nvcc slot for a kernel stage) take units longest expected build first, else in the
order given (spread across nodes by the store's arrival order), and claim each without
waiting:

    mine       build it here, publish it, release the claim
    published  another node built it: the collector installs it
    held       another node is building it: move on; the collector comes back for it

The collector thread installs what was published (in batches), looks again at what was
held whenever a claim is released (pub/sub) or every ``poll`` seconds, and hands a unit
whose claimer died (its claim expired: it renews a short TTL while alive) back to the
compile threads, first in line; so too a unit held for longer than ``wait_limit`` (the
single-flight timeout), built here without its claim: no claim, planted or stuck, holds a
node longer (a foreign-looking one is taken over at once by the store: warmd.store.claimid).
The loop ends when every unit is built or installed (or failed). Without a shared cache
every claim is ``mine``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from warmd.cache.base import CacheAdapter
from warmd.coordination import ClaimState, WorkKind
from warmd.warmup.events import Event, KernelEvent, RunEvents

if TYPE_CHECKING:
    from warmd.store.api import SharedCache

log = logging.getLogger(__name__)
C = TypeVar("C")  # what a compile thread holds (its worker process, or nothing)
POLL_SECONDS = 0.25


@dataclass(eq=False)
class Unit:
    """One unit of cluster work: an entry, a task whose entries are not known before it
    runs (its name is the task key), or a discovery slice (its name is its task digest)."""

    name: str
    adapter: CacheAdapter
    kind: WorkKind = WorkKind.ENTRY
    payload: object = None  # what the builder needs (a sub-task, a job)
    claimed: bool = False  # the collector took the claim over from a dead claimer
    waited_since: float | None = None  # first found held by another node
    local_only: bool = False  # published, yet not installable here: built without a claim
    expected: float = 0.0  # its expected build seconds: the longest known is taken first


@dataclass
class Built:
    """What a builder says of one unit."""

    ok: bool
    seconds: float = 0.0
    error: str = ""


@dataclass
class LoopTimeline:
    began: float = field(default_factory=time.monotonic)
    first_compile: float | None = None
    last_compile_end: float | None = None
    last_install: float | None = None
    ended: float | None = None

    def to_json(self) -> dict:
        def at(moment: float | None) -> float | None:
            return None if moment is None else round(moment - self.began, 3)

        return {"first_compile": at(self.first_compile),
                "last_compile_end": at(self.last_compile_end),
                "last_install": at(self.last_install), "ended": at(self.ended)}


def _first_to_take(unit: Unit) -> tuple[bool, float]:
    """A unit handed back (its claimer died, or it is not installable here) before any
    other; then the longest expected build (the cluster's last builds are then short ones,
    and its nodes finish together)."""
    return unit.claimed or unit.local_only, unit.expected


def store_order(shared: SharedCache | None, names: list[str]) -> list[str]:
    """The order this node should claim units in: the store's, so that nodes starting
    together start on different units (this order when there is none, or it fails)."""
    if shared is None:
        return names
    try:
        return shared.claims.shard_order(names)
    except Exception:  # an optimisation only
        return names


class ClaimLoop(Generic[C]):
    """See the module docstring. ``build(unit, context)`` builds and publishes a unit it
    holds the claim of; ``install(adapter, units)`` installs published ones and returns the
    names now present. Units may be added while it runs (a discovery names them as it
    goes) until ``close``. What becomes of each unit goes to the run's ``events``."""

    def __init__(self, shared: SharedCache | None, contexts: list[C],
                 build: Callable[[Unit, C], Built],
                 install: Callable[[CacheAdapter, list[Unit]], set[str]],
                 events: RunEvents,
                 poll: float = POLL_SECONDS,
                 done: Callable[[Unit, Event], None] | None = None,
                 wait_limit: float = 3600.0,
                 begun: Callable[[Unit], None] | None = None) -> None:
        self.shared, self.contexts, self.build, self.install = shared, contexts, build, install
        self.events = events
        self.done = done  # hears of each unit's last event (built, installed, failed)
        self.begun = begun  # hears of each unit as its build here begins
        self.poll = poll
        self.wait_limit = wait_limit  # the longest a unit held by another node is waited on
        self.timeline = LoopTimeline()
        self._pending: collections.deque[Unit] = collections.deque()
        self._waiting: list[Unit] = []  # held by others, or published: the collector's
        self._seen: set[str] = set()
        self._busy = 0  # units a compile thread or the collector is working on
        self._closed = False
        self._stop = threading.Event()
        self._cond = threading.Condition()

    # -- feeding it --

    def add(self, units: list[Unit]) -> None:
        with self._cond:
            for unit in units:
                if unit.name not in self._seen:
                    self._seen.add(unit.name)
                    self._pending.append(unit)
            self._cond.notify_all()

    def close(self) -> None:
        """No more units will be added."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    # -- running it --

    def run(self) -> None:
        threads = [threading.Thread(target=self._compile_loop, args=(ctx,), daemon=True,
                                    name=f"warmd-claims-{i}")
                   for i, ctx in enumerate(self.contexts or [None])]  # type: ignore[list-item]
        collector = threading.Thread(target=self._collect_loop, daemon=True,
                                     name="warmd-collector")
        for thread in [*threads, collector]:
            thread.start()
        for thread in [*threads, collector]:
            while thread.is_alive():
                thread.join(timeout=0.2)
        self.timeline.ended = time.monotonic()

    def _done(self) -> bool:
        """Under the lock: nothing left to do and nothing can come back."""
        return self._stop.is_set() or (self._closed and not self._pending and not self._busy
                                        and not self._waiting)

    def _next(self) -> Unit | None:
        with self._cond:
            while not self._pending:
                if self._done():
                    self._cond.notify_all()
                    return None
                self._cond.wait(timeout=0.5)
            if self._stop.is_set():
                return None
            self._busy += 1
            unit = max(self._pending, key=_first_to_take)  # the first of equals: as given
            self._pending.remove(unit)
            return unit

    def _compile_loop(self, context: C) -> None:
        while (unit := self._next()) is not None:
            try:
                self._one(unit, context)
            except Exception as exc:  # a broken store or builder fails the unit, not the loop
                log.exception("cluster work on %s failed", unit.name)
                self._finish(unit, KernelEvent.FAILED, error=f"{exc}")
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _one(self, unit: Unit, context: C) -> None:
        state = ClaimState.MINE
        if not unit.claimed and not unit.local_only and self.shared is not None:
            state = self.shared.claims.claim(unit.adapter, unit.name, unit.kind).state
        if state is not ClaimState.MINE:
            if state is ClaimState.HELD and unit.waited_since is None:
                unit.waited_since = time.monotonic()
                self._note(unit, KernelEvent.WAITED)
            with self._cond:
                self._waiting.append(unit)
                self._cond.notify_all()
            return
        self._note(unit, KernelEvent.CLAIMED)
        began = time.monotonic()
        with self._cond:
            if self.timeline.first_compile is None:
                self.timeline.first_compile = began
        self._tell(self.begun, unit)
        try:
            built = self.build(unit, context)
        finally:
            if self.shared is not None and not unit.local_only:
                self.shared.claims.release(unit.adapter, unit.name, unit.kind)
        ended = time.monotonic()
        with self._cond:
            self.timeline.last_compile_end = ended
        self._finish(unit, KernelEvent.BUILT if built.ok else KernelEvent.FAILED,
                     built.seconds or ended - began, built.error)

    def _take_back(self, unit: Unit) -> None:
        """Hand a unit held elsewhere back to the compile threads, first in line, to be
        built without claiming it again."""
        unit.claimed = True
        self._note(unit, KernelEvent.TOOK_OVER)
        with self._cond:
            self._pending.appendleft(unit)
            self._cond.notify_all()

    def _waited(self, unit: Unit, now: float) -> float:
        return 0.0 if unit.waited_since is None else round(now - unit.waited_since, 3)

    def _note(self, unit: Unit, kind: KernelEvent, seconds: float = 0.0,
              error: str = "") -> Event:
        event = Event(kind, unit.adapter.library, unit.name, unit.kind, seconds, error)
        self.events.add(event)
        return event

    def _finish(self, unit: Unit, kind: KernelEvent, seconds: float = 0.0,
                error: str = "") -> None:
        self._tell(self.done, unit, self._note(unit, kind, seconds, error))
        with self._cond:
            self._cond.notify_all()

    @staticmethod
    def _tell(callback: Callable[..., None] | None, unit: Unit, *args: object) -> None:
        if callback is not None:
            try:
                callback(unit, *args)
            except Exception:  # a report or display problem must not stop the loop
                log.exception("reporting %s failed", unit.name)

    # -- the collector --

    def _collect_loop(self) -> None:
        while True:
            with self._cond:
                if self._done():
                    self._cond.notify_all()
                    return
                waiting, self._waiting = self._waiting, []
                self._busy += len(waiting)
            if not waiting:
                with self._cond:
                    self._cond.wait(timeout=0.2)
                continue
            try:
                left = self._collect(waiting)
            except Exception:  # the store failed under us: look again next round
                log.exception("collecting cluster work failed")
                left = waiting
            with self._cond:
                self._waiting = left + self._waiting
                self._busy -= len(waiting)
                self._cond.notify_all()
            if left and len(left) == len(waiting) and self.shared is not None:
                self.shared.claims.wait(left[0].adapter, self.poll)  # nothing moved

    def _collect(self, waiting: list[Unit]) -> list[Unit]:
        """Install what is published, hand back what is free again; the units still held."""
        assert self.shared is not None
        held, published = [], []
        for unit in waiting:
            state = self.shared.claims.claim(unit.adapter, unit.name, unit.kind).state
            if state is ClaimState.PUBLISHED:
                published.append(unit)
            elif state is ClaimState.MINE:  # its claimer gave up or died: ours now
                self._take_back(unit)
            elif self._waited(unit, time.monotonic()) >= self.wait_limit:
                self.shared.claims.stop_waiting(unit.adapter, unit.name, self._waited(
                    unit, time.monotonic()))
                self._take_back(unit)
            else:
                held.append(unit)
        by_adapter: dict[int, list[Unit]] = {}
        for unit in published:
            by_adapter.setdefault(id(unit.adapter), []).append(unit)
        for units in by_adapter.values():
            present = self.install(units[0].adapter, units)
            now = time.monotonic()
            for unit in units:
                if unit.name in present:
                    with self._cond:
                        self.timeline.last_install = now
                    self._finish(unit, KernelEvent.INSTALLED)
                else:  # published, but not usable here (refused, incompatible): build it
                    unit.local_only = True
                    with self._cond:
                        self._pending.appendleft(unit)
                        self._cond.notify_all()
        return held
