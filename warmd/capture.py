"""Capture what the engine really compiles on a node, share it, and count JIT after READY.

After a node is READY its agent watches every registered library's cache directories
(``CacheAdapter.watch_dirs``; inotify through watchdog, else polling, and a periodic rescan
either way). Each complete entry that appears is a *runtime JIT*: a kernel the warmup did
not predict, compiled in traffic. It is recorded (library, entry, node, time) and published
once cluster-wide as a *learned* entry of every plan the node warmed:

- verified first: packed by its adapter (complete entries only, no links, no odd names) and
  checked the way an install checks an archive (``check_artifact``: no traversal, links or
  devices, not over WARMD_MAX_ARTIFACT_BYTES); an entry that fails is refused, counted,
  never published;
- published through the shared cache's task path (``publish_task``): one task record per
  entry, ``learned_task(plan, entry)``, signed when signing is on, its manifest once per
  fingerprint; then its name joins the plan's learned index (``SharedCache.add_learned``, a
  set, so nodes capturing at once lose nothing);
- installed on every node that warms the plan, before READY (``install_learned``, through
  ``prefetch``: the same verification as any task).

A scan on start publishes every complete entry on disk that no local task record names and
the learned index does not hold yet, so a watcher that fell behind or restarted loses
nothing; entries present at start are not counted as runtime JIT (a restarted agent re-warms
first). An entry the engine deletes is forgotten (compiled again, it counts again); one it
rewrites under the same name is the same kernel (names are content keys) and not sent twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from warmd import settings
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.records import recorded_entries
from warmd.stats import CounterFlag, ids

if TYPE_CHECKING:
    from warmd.store.api import SharedCache
    from warmd.targets import Target

log = logging.getLogger(__name__)

LEARNED = "learned"
POLL_SECONDS = 2.0  # without inotify: how often the caches are scanned
RESCAN_SECONDS = 30.0  # with inotify: a full scan anyway (events can be dropped)
SETTLE_SECONDS = 0.2  # after an event, let the writer finish its renames
MAX_EVENTS = 50  # runtime JIT events kept in the node record (the count keeps counting)


def learned_task(plan_key: str, entry: str) -> str:
    """The task key a learned entry is published under (one record per entry)."""
    return f"{LEARNED}:{plan_key}:{entry}"


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


@dataclass(frozen=True)
class CaptureScope:
    """One model the node warmed: its plan key, the target it was planned for (part of every
    fingerprint) and each library's cache root on this node."""

    plan_key: str
    target: dict  # Target.to_json()
    roots: dict[str, str]  # library -> cache root

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CaptureScope:
        return cls(str(data["plan_key"]), dict(data["target"]),
                   {str(k): str(v) for k, v in data["roots"].items()})

    def target_object(self) -> Target:
        from warmd.targets import Target, parse_capability

        t = self.target
        return Target(t["name"], parse_capability(t["capability"]), int(t["sms"]),
                      int(t.get("count", 1)), t.get("driver"), t.get("cuda"),
                      t.get("source", "preset"))


def scope_of(plan, roots: dict[str, Path]) -> CaptureScope:
    """The capture scope of a plan warmed with these cache roots (WarmupOptions.cache_roots)."""
    return CaptureScope(plan.key, plan.env.target.to_json(),
                        {lib: str(root) for lib, root in roots.items()})


def adapters_for(scope: CaptureScope) -> dict[str, CacheAdapter]:
    """Every registered library's cache adapter at the scope's roots, for the libraries
    installed here (nothing else can compile into a cache, or use an installed entry)."""
    from warmd.libraries import LIBRARIES, probe_library

    arch = scope.target_object().arch
    found = {}
    for name, library in LIBRARIES.items():
        if not probe_library(name).available:
            continue
        root = Path(scope.roots.get(name) or library.root.default())
        try:
            adapter = library.make_adapter(root, arch)
        except ModuleNotFoundError:  # the library's own imports: nothing to watch, no crash
            adapter = None
        if adapter is not None:
            found[name] = adapter
    return found


def missed_by(library: str) -> str:
    """Which planner rule would have missed a learned entry of this library."""
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(library)
    if registered is None:
        return f"{library}: not a library this warmd knows"
    if not registered.plans_tasks:
        return (f"no planner rule: {registered.display} entries are compiled by the engine "
                "at run time (captured only)")
    return (f"{registered.display} rules: no task of the plan produced it (the planner did "
            "not select this kernel, shape or module)")


def learned_rows(indexes: list[dict]) -> list[dict]:
    """One row per learned entry of store.admin.learned_indexes, with the rule that missed it."""
    return [{"plan": i["plan"], "library": i["library"], "entry": name,
             "fingerprint": i["fingerprint"], "missed_by": missed_by(i["library"])}
            for i in indexes for name in i["entries"]]


def install_learned(shared: SharedCache, adapter: CacheAdapter, plan_key: str) -> list[str]:
    """Install every learned entry of the plan (verified like any task); returns the names
    now present."""
    names = shared.learned(adapter, plan_key)
    if not names:
        return []
    fetched = shared.prefetch(adapter, [learned_task(plan_key, n) for n in names])
    return sorted({n for got in fetched.values() if got for n in got})


def verify_for_publishing(adapter: CacheAdapter, entry: CacheEntry) -> str | None:
    """Why an entry must not be published (None: it may): packing refuses incomplete
    entries and links, the archive check refuses traversal, devices and oversize."""
    from warmd.cache.artifacts import check_artifact

    try:
        check_artifact(adapter.pack(entry), settings.max_artifact_bytes())
    except UnsafeArtifact as exc:
        return str(exc)
    return None


def publish_learned(shared: SharedCache, adapter: CacheAdapter, plan_keys: list[str],
                    entries: list[CacheEntry], seconds: float = 0.0) -> list[str]:
    """Publish verified entries as learned entries of each plan; returns the names the store
    took (published now or by another node before)."""
    taken = []
    for entry in entries:
        done = [shared.publish_task(adapter, learned_task(plan, entry.name), [entry], seconds)
                for plan in plan_keys]
        if any(publication.stored for publication in done):
            taken.append(entry.name)
    if taken:
        for plan in plan_keys:
            shared.add_learned(adapter, plan, taken)
    return taken


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


JitCallback = Callable[[RuntimeJit], None]
# (counter of stats.COUNTERS with CounterFlag.CAPTURE, library, amount): runtime_jit,
# captured (published as learned, or found published), capture_refused (unsafe or
# oversize: never published)
CountCallback = Callable[[str, str, int], None]


class Capture:
    """Watches a node's caches from READY on (``start``) until ``stop``."""

    def __init__(self, node: str, scopes: list[CaptureScope],
                 open_shared: Callable[[Target], SharedCache | None],
                 on_runtime_jit: JitCallback | None = None,
                 on_count: CountCallback | None = None, inotify: bool = True,
                 poll_seconds: float = POLL_SECONDS, env: dict[str, str] | None = None
                 ) -> None:
        self.node = node
        self.env = env or {}  # the node's warm environment (namespace, key file)
        self.on_runtime_jit = on_runtime_jit
        self.on_count = on_count
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
        return "inotify" if self._observer is not None else "polling"

    # ----- lifecycle -----

    def start(self) -> None:
        """Scan (publishing what no task and no learned record names), then watch. The
        scan runs in the node's warm environment, where each cache's fingerprint is taken
        (namespace salt, signing key), so the capture publishes where the warmup reads."""
        with settings.scoped_env(self.env):
            for watched in self._watched:
                self._catch_up(watched)
        if self.inotify:
            self._observer = _start_watcher(
                [d for w in self._watched for d in w.adapter.watch_dirs()], self._dirty.set)
        self._thread = threading.Thread(target=self._loop, name="warmd-capture", daemon=True)
        self._thread.start()
        log.info("capture watching %d cache(s) (%s)", len(self._watched), self.mode)

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
        present = {e.name: e for e in _complete(watched.adapter) or []}
        watched.known = set(present)
        if watched.shared is None:
            return
        shared_already: set[str] = set()
        for plan in watched.plans:  # also fixes the cache's fingerprint, in self.env
            shared_already.update(watched.shared.learned(watched.adapter, plan))
        unplanned = set(present) - recorded_entries(watched.adapter.root) - shared_already
        self._publish(watched, [present[n] for n in sorted(unplanned)])

    def scan(self) -> list[RuntimeJit]:
        """Look at every cache once: new complete entries are runtime JIT, published (and
        those not published yet are tried again, not counted again)."""
        found = []
        for watched in self._watched:
            listed = _complete(watched.adapter)
            if listed is None:  # unreadable now: judge nothing (a later scan will)
                continue
            current = {e.name: e for e in listed}
            new = sorted(set(current) - watched.known)
            watched.known = set(current)  # deleted entries are forgotten
            again = sorted((watched.retry & set(current)) - set(new))
            watched.retry &= set(current)
            if again:
                self._publish(watched, [current[n] for n in again])
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
            self._publish(watched, [current[n] for n in new])
            found += events
        return found

    def _publish(self, watched: _Watched, entries: list[CacheEntry]) -> None:
        good = []
        for entry in entries:
            try:
                why = verify_for_publishing(watched.adapter, entry)
            except (OSError, ValueError) as exc:  # vanished or being rewritten: try again
                watched.retry.add(entry.name)
                log.info("capture: %s %s changed while packing (%s); trying again later",
                         watched.library, entry.name, exc)
                continue
            if why is None:
                good.append(entry)
                continue
            self._count("capture_refused", watched.library)
            log.warning("capture: not publishing %s %s: %s", watched.library, entry.name, why)
        if watched.shared is None or not good:
            return
        taken = publish_learned(watched.shared, watched.adapter, watched.plans, good)
        watched.retry |= {e.name for e in good} - set(taken)  # the store did not take them
        watched.retry -= set(taken)
        self._count("captured", watched.library, len(taken))


def _complete(adapter: CacheAdapter) -> list[CacheEntry] | None:
    """The complete entries; None when the cache cannot be read now."""
    try:
        return adapter.list_entries()
    except OSError as exc:  # the cache directory is being removed or is unreadable
        log.warning("capture: cannot list %s: %s", adapter.root, exc)
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
