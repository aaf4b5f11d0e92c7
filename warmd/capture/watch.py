"""A node's capture from READY on: its caches watched (inotify through watchdog, else
polling, and a periodic rescan either way) in a thread of its own, each complete entry that
appears counted once as runtime JIT and shared as the cluster's ``CaptureTrust`` says."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.records import recorded_entries
from warmd.capture.scope import CaptureScope, adapters_for
from warmd.capture.sharing import publish_learned, submit_captures, verified_artifact
from warmd.stats import CounterFlag, ids

if TYPE_CHECKING:
    from warmd.store.api import SharedCache
    from warmd.targets import Target

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0  # without inotify: how often the caches are scanned
RESCAN_SECONDS = 30.0  # with inotify: a full scan anyway (events can be dropped)
SETTLE_SECONDS = 0.2  # after an event, let the writer finish its renames
MAX_EVENTS = 50  # runtime JIT events kept in the node record (the count keeps counting)
MAX_TRIES = 5  # scans an entry that cannot be packed yet (mid-rewrite) is tried again


class CaptureTrust(enum.StrEnum):
    """What a cluster does with what its serving nodes' caches hold (warmd.yaml
    ``capture.trust``)."""

    REDERIVE = "rederive"  # pending, until a trusted producer rebuilds it (warmd.rederive)
    OWN_NODES = "own-nodes"  # published signed by the capturing node itself
    OFF = "off"  # counted, never shared


@dataclass(frozen=True)
class RuntimeJit:
    """An entry that appeared on a node after READY: a kernel compiled in traffic."""

    library: str
    entry: str
    node: str
    at: float
    seconds: float | None = None  # compile seconds, where the library records them

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class _Watched:
    """One cache on this node: its adapter, the shared cache of its target, the plans it
    learns for and the complete entries seen so far."""

    library: str
    adapter: CacheAdapter
    shared: SharedCache | None
    plans: list[str]
    known: set[str] = field(default_factory=set)
    retry: set[str] = field(default_factory=set)  # not published yet (vanished, store down)
    counted: set[str] = field(default_factory=set)  # counted as runtime JIT (once each)
    shared_names: set[str] = field(default_factory=set)  # taken by the store (never again)
    tries: dict[str, int] = field(default_factory=dict)  # packing attempts that failed


JitCallback = Callable[[RuntimeJit], None]
# (counter of stats.COUNTERS with CounterFlag.CAPTURE, library, amount): runtime_jit,
# captured (shared as a pending capture or a learned entry, or found shared),
# capture_refused (unsafe or oversize: never shared), capture_failed (an error reading or
# sharing an entry)
CountCallback = Callable[[str, str, int], None]


class Capture:
    """Watches a node's caches from READY on (``start``) until ``stop``."""

    def __init__(self, node: str, scopes: list[CaptureScope],
                 open_shared: Callable[[Target], SharedCache | None],
                 on_runtime_jit: JitCallback | None = None,
                 on_count: CountCallback | None = None, inotify: bool = True,
                 poll_seconds: float = POLL_SECONDS,
                 trust: CaptureTrust = CaptureTrust.REDERIVE,
                 on_started: Callable[[], None] | None = None) -> None:
        self.node = node
        self.trust = CaptureTrust(trust)
        self.on_runtime_jit = on_runtime_jit
        self.on_count = on_count
        self.on_started = on_started
        self.started = threading.Event()  # set once the scan on start and the watch began
        self.inotify = inotify
        self.poll_seconds = poll_seconds
        self.counts: dict[str, dict[str, int]] = {i: {} for i in ids(CounterFlag.CAPTURE)}
        self.events: list[RuntimeJit] = []
        self._watched = self._watch_list(scopes, open_shared)
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._observer = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def _watch_list(scopes: list[CaptureScope], open_shared) -> list[_Watched]:
        by_cache: dict[tuple, _Watched] = {}
        shared_by_target: dict[str, SharedCache | None] = {}
        for scope in scopes:
            target = scope.target_object()
            tkey = json.dumps(scope.target, sort_keys=True)
            if tkey not in shared_by_target:
                shared_by_target[tkey] = open_shared(target)
            for library, adapter in adapters_for(scope).items():
                key = (library, str(adapter.root), target.arch, tkey)
                watched = by_cache.setdefault(key, _Watched(library, adapter,
                                                            shared_by_target[tkey], []))
                if scope.plan_key not in watched.plans:
                    watched.plans.append(scope.plan_key)
        return list(by_cache.values())

    def total(self, counter: str) -> int:
        return sum(self.counts[counter].values())

    def _count(self, counter: str, library: str, amount: int = 1) -> None:
        if not amount:
            return
        with self._lock:
            by_library = self.counts[counter]
            by_library[library] = by_library.get(library, 0) + amount
        if self.on_count is not None:
            self.on_count(counter, library, amount)

    @property
    def mode(self) -> str:
        if not self.started.is_set():
            return "starting"
        return "inotify" if self._observer is not None else "polling"

    # ----- lifecycle -----

    def start(self) -> None:
        """Start the capture's thread and return at once: it scans (sharing what no task
        and no learned or pending record names), then watches. ``open_shared`` opens each
        target's shared cache with the node's context (namespace salt, signing key), so the
        capture shares where the warmup reads."""
        self._thread = threading.Thread(target=self._run, name="warmd-capture", daemon=True)
        self._thread.start()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Whether the scan on start finished (and the watch began) within timeout."""
        return self.started.wait(timeout)

    def _run(self) -> None:
        try:
            for watched in self._watched:
                if self._stop.is_set():
                    return
                self._catch_up(watched)
            if self.inotify and not self._stop.is_set():
                self._observer = _start_watcher(
                    [d for w in self._watched for d in w.adapter.watch_dirs()], self._dirty.set)
        except Exception:  # a capture problem must never take the agent down
            log.exception("capture: the scan on start failed")
        self.started.set()
        log.info("capture watching %d cache(s) (%s, trust %s)", len(self._watched), self.mode,
                 self.trust)
        if self.on_started is not None:
            self.on_started()
        self._loop()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for shared in {id(w.shared): w.shared for w in self._watched if w.shared}.values():
            with contextlib.suppress(Exception):
                shared.close()

    def _loop(self) -> None:
        rescan = time.monotonic()
        while not self._stop.is_set():
            watcher = self._observer
            # a directory not there yet is looked for at the polling pace
            interval = RESCAN_SECONDS if watcher is not None and not watcher.pending \
                else self.poll_seconds
            woke = self._dirty.wait(timeout=interval)
            if woke:
                self._stop.wait(SETTLE_SECONDS)
            self._dirty.clear()
            adopted = watcher is not None and bool(watcher.pending) and watcher.adopt()
            if not (woke or adopted or watcher is None
                    or time.monotonic() - rescan >= RESCAN_SECONDS):
                continue  # nothing happened: no scan until an event or the rescan time
            rescan = time.monotonic()
            if self._stop.is_set():
                return
            try:
                self.scan()
            except Exception:  # a capture problem must never take the agent down
                log.exception("capture scan failed")

    # ----- scanning -----

    def _catch_up(self, watched: _Watched) -> None:
        present = {e.name: e for e in self._complete(watched) or []}
        watched.known = set(present)
        if watched.shared is None or self.trust is CaptureTrust.OFF:
            return
        shared_already: set[str] = set()
        for plan in watched.plans:  # also fixes the cache's fingerprint
            shared_already.update(watched.shared.lists.learned(watched.adapter, plan))
        if self.trust is CaptureTrust.REDERIVE:
            shared_already.update(watched.shared.captures.pending(watched.adapter))
        try:
            recorded = recorded_entries(watched.adapter.root)
        except Exception as exc:  # this node's own records unreadable: judge nothing now
            self._failed(watched, "its task records", exc)
            return
        unplanned = set(present) - recorded - shared_already
        self._publish(watched, [present[n] for n in sorted(unplanned)])

    def scan(self) -> list[RuntimeJit]:
        """Look at every cache once: new complete entries are runtime JIT, published (and
        those not published yet are tried again, not counted again)."""
        found = []
        for watched in self._watched:
            listed = self._complete(watched)
            if listed is None:  # unreadable now: judge nothing (a later scan will)
                continue
            current = {e.name: e for e in listed}
            appeared = sorted(set(current) - watched.known)
            watched.known = set(current)  # an entry gone and back is looked at again
            again = sorted((watched.retry & set(current)) - set(appeared))
            watched.retry &= set(current)
            if again:
                self._publish(watched, [current[n] for n in again])
            unshared = [n for n in appeared if n not in watched.shared_names]
            if unshared:
                self._publish(watched, [current[n] for n in unshared])
            new = [n for n in appeared if n not in watched.counted]  # runtime JIT once each
            watched.counted.update(new)
            if not new:
                continue
            now = time.time()
            events = [RuntimeJit(watched.library, name, self.node, now) for name in new]
            with self._lock:
                self.events = (self.events + events)[-MAX_EVENTS:]
            for event in events:
                log.warning("runtime JIT on %s: %s %s (compiled after READY)", self.node,
                            event.library, event.entry)
                if self.on_runtime_jit is not None:
                    self.on_runtime_jit(event)
            self._count("runtime_jit", watched.library, len(events))
            found += events
        return found

    def _publish(self, watched: _Watched, entries: list[CacheEntry]) -> None:
        """Share entries as the cluster's trust says: each packed and checked first (what
        fails is refused and counted), each error caught and counted for that entry."""
        if self.trust is CaptureTrust.OFF or watched.shared is None:
            return
        packed: dict[str, bytes] = {}
        for entry in entries:
            try:
                packed[entry.name] = verified_artifact(watched.adapter, entry)
            except UnsafeArtifact as exc:
                self._count("capture_refused", watched.library)
                log.warning("capture: not sharing %s %s: %s", watched.library, entry.name, exc)
            except (OSError, ValueError) as exc:  # vanished or being rewritten: again later
                self._try_again(watched, entry.name, exc)
            except Exception as exc:  # a bug, a library's surprise: this entry only
                self._failed(watched, entry.name, exc)
        if not packed:
            return
        try:
            if self.trust is CaptureTrust.OWN_NODES:
                good = [e for e in entries if e.name in packed]
                taken = publish_learned(watched.shared, watched.adapter, watched.plans, good)
            else:
                taken = submit_captures(watched.shared, watched.adapter, watched.plans, packed)
        except Exception as exc:  # the store degrades instead of raising; a bug still must not
            self._failed(watched, f"{len(packed)} entries", exc)
            taken = []
        watched.retry |= set(packed) - set(taken)  # the store did not take them
        watched.retry -= set(taken)
        watched.shared_names.update(taken)
        self._count("captured", watched.library, len(taken))

    def _try_again(self, watched: _Watched, name: str, exc: Exception) -> None:
        tries = watched.tries[name] = watched.tries.get(name, 0) + 1
        if tries >= MAX_TRIES:
            watched.retry.discard(name)
            self._failed(watched, name, exc)
            return
        watched.retry.add(name)
        log.info("capture: %s %s changed while packing (%s); trying again later",
                 watched.library, name, exc)

    def _failed(self, watched: _Watched, what: str, exc: BaseException) -> None:
        self._count("capture_failed", watched.library)
        log.warning("capture: %s %s: %s: %s", watched.library, what, type(exc).__name__, exc)

    def _complete(self, watched: _Watched) -> list[CacheEntry] | None:
        """The complete entries; None when the cache cannot be read now (counted unless it
        is only missing or being removed)."""
        try:
            return watched.adapter.list_entries()
        except OSError as exc:  # the cache directory is being removed or is unreadable
            log.warning("capture: cannot list %s: %s", watched.adapter.root, exc)
        except Exception as exc:  # RecursionError, a library's surprise: counted, not fatal
            self._failed(watched, f"listing {watched.adapter.root}", exc)
        return None


class _Watcher:
    """inotify over the cache directories (watchdog), waking the capture on any change.
    Directories that do not exist yet are not created (they are the engine's): ``adopt``
    starts watching each once it appears."""

    def __init__(self, dirs: list[Path], wake: Callable[[], None]) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        class _Wake(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                wake()

        self.handler = _Wake()
        self.pending = [Path(d) for d in dict.fromkeys(dirs)]
        self.observer = Observer()
        self.observer.start()

    def adopt(self) -> bool:
        """Watch the pending directories that exist now; True when one was added."""
        added = False
        for directory in [d for d in self.pending if d.is_dir()]:
            self.observer.schedule(self.handler, str(directory), recursive=True)
            self.pending.remove(directory)
            added = True
        return added

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=5)


def _start_watcher(dirs: list[Path], wake: Callable[[], None]) -> _Watcher | None:
    """The inotify watcher; None (polling) when watchdog is missing or cannot watch here."""
    try:
        watcher = _Watcher(dirs, wake)
        watcher.adopt()
    except Exception as exc:  # no watchdog, inotify limits: polling still works
        log.warning("capture: inotify unavailable (%s); polling every %.0fs", exc,
                    POLL_SECONDS)
        return None
    return watcher
