"""The trusted producer's side of capture: pending captures rebuilt and published as signed,
installable learned entries.

A capture (warmd.capture, ``SharedCache.captures.submit``) is what a serving node's cache held:
bytes nothing vouches for. A node the operator trusts to produce code (warmd.yaml
``capture.rederive_nodes``) reads the captures under each fingerprint it can build for,
hands each to its library's plugin (``LibraryPlugin.rederive``: Triton compiles this node's
own allow-listed kernel function for the specialisation whose key is the capture's, FlashInfer
regenerates the module from its URI, DeepGEMM fills the extension's own template with the
capture's template arguments, autotune results pass FlashInfer's own checks), and publishes
*what it built* (``publish_learned``: signed with the cluster key when signing is on), then
drops the capture. A capture the re-derivation
refuses is dropped and counted; one this node cannot judge (no compiler, no GPU) stays for
another trusted producer. Each capture is handled on its own: one failure never stops the
others.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.install import check_artifact
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveMismatch,
    private_dir,
)
from warmd.capture.scope import CaptureScope, adapters_for
from warmd.capture.sharing import publish_learned
from warmd.context import NodeContext

if TYPE_CHECKING:
    from warmd.libraries.plugin import LibraryPlugin
    from warmd.store.api import SharedCache
    from warmd.targets import Target

log = logging.getLogger(__name__)

POLL_SECONDS = 5.0  # how often a trusted producer looks for new captures


@dataclass(frozen=True)
class CaptureResult:
    """What re-deriving one capture did: "rederived" (published; ``identical`` says whether
    the rebuilt bytes were the capture's), "quarantined" (its source is not the library's:
    dropped, never published), "refused" (dropped), "kept" (this node cannot judge it:
    left pending) or "failed" (an error: left pending)."""

    library: str
    name: str
    outcome: str
    identical: bool = False
    why: str = ""


class _Prebuilt(CacheAdapter):
    """The library's adapter, packing the artifact this node re-derived instead of a cache
    directory (the fingerprint, hence where it is published, is the adapter's)."""

    def __init__(self, adapter: CacheAdapter, artifact: bytes) -> None:
        self.adapter, self.artifact = adapter, artifact
        self.library = adapter.library

    @property
    def root(self) -> Path:
        return self.adapter.root

    def list_entries(self) -> list[CacheEntry]:
        return []

    def pack(self, entry: CacheEntry) -> bytes:
        return self.artifact

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        raise UnsafeArtifact("a re-derived artifact is published, not installed here")

    def fingerprint_inputs(self) -> dict:
        return self.adapter.fingerprint_inputs()


def rederive_library(library: str) -> Callable[..., Rederived]:
    """The library's re-derivation function; CannotRederiveHere when it has none."""
    plugin = _plugin(library)
    if plugin is None or plugin.rederivation is None:
        raise CannotRederiveHere(f"{library} entries cannot be re-derived")
    return plugin.rederive


def _plugin(library: str) -> LibraryPlugin | None:
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(library)
    return registered.plugin() if registered is not None else None


NOT_REDERIVED = "not re-derived: its captures stay on the node that built them"


def how_rederived(library: str) -> str:
    """How a trusted producer re-derives the library's captures (its plugin's
    ``rederivation``), or that it does not."""
    plugin = _plugin(library)
    how = plugin.rederivation if plugin is not None else None
    return how or NOT_REDERIVED


def captured_libraries(task_libraries: set[str]) -> list[str]:
    """The libraries whose kernels a plan's engine may compile after READY: those of its
    tasks, and those that plan no tasks but are captured and re-derived (Triton, whose
    kernels engines compile at run time whatever the plan)."""
    from warmd.libraries import LIBRARIES

    plugins = {name: lib.plugin() for name, lib in LIBRARIES.items()}
    runtime = {name for name, plugin in plugins.items()
               if not plugin.plans_tasks and plugin.rederivation is not None}
    return sorted(set(task_libraries) | runtime)


def rederivation_lines(libraries: list[str]) -> list[str]:
    """'<library>: <how>' for each library, as `warmd status` and `warmd plan` show it."""
    return [f"{library}: {how_rederived(library)}" for library in libraries]


def rederive_capture(shared: SharedCache, adapter: CacheAdapter, name: str, context: NodeContext,
                   scratch_root: Path | None = None) -> CaptureResult:
    """Re-derive one pending capture and publish the result, on the producer of context;
    never raises."""
    from warmd.store.validation import BadRecord

    library = adapter.library
    try:
        found = shared.captures.read(adapter, name)
    except BadRecord as exc:
        shared.captures.drop(adapter, name)
        return CaptureResult(library, name, "refused", why=f"malformed capture: {exc}")
    except Exception as exc:  # the store degrades; anything else is a bug, not fatal
        return CaptureResult(library, name, "failed", why=f"{type(exc).__name__}: {exc}")
    if found is None:
        return CaptureResult(library, name, "kept", why="capture not readable now")
    capture, artifact = found
    scratch = private_dir("warmd-rederive-", scratch_root)
    try:
        check_artifact(artifact, context.store.max_artifact_bytes)
        rebuilt = rederive_library(library)(adapter, name, artifact, scratch, context)
        check_artifact(rebuilt.artifact, context.store.max_artifact_bytes)
    except CannotRederiveHere as exc:
        return CaptureResult(library, name, "kept", why=str(exc))
    except RederiveMismatch as exc:
        shared.captures.drop(adapter, name, capture.chunks)
        return CaptureResult(library, name, "quarantined", why=str(exc))
    except UnsafeArtifact as exc:  # RederiveRefused among them
        shared.captures.drop(adapter, name, capture.chunks)
        return CaptureResult(library, name, "refused", why=str(exc))
    except Exception as exc:  # a rebuild step's surprise: this capture only, left pending
        return CaptureResult(library, name, "failed", why=f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    entry = CacheEntry(library, name, adapter.root / name)
    taken = publish_learned(shared, _Prebuilt(adapter, rebuilt.artifact), list(capture.plans),
                            [entry], capture.compile_seconds)
    if not taken:
        return CaptureResult(library, name, "failed", rebuilt.identical,
                           why="the store did not take the re-derived entry")
    shared.captures.drop(adapter, name, capture.chunks)
    return CaptureResult(library, name, "rederived", rebuilt.identical,
                       ", ".join(rebuilt.differs))


def rederive_pending(shared: SharedCache, adapter: CacheAdapter, context: NodeContext,
                     skip: set[str] | None = None) -> list[CaptureResult]:
    """Every pending capture under the adapter's fingerprint (but those in skip)."""
    return [rederive_capture(shared, adapter, name, context)
            for name in shared.captures.pending(adapter) if name not in (skip or set())]


CountCallback = Callable[[str, str, int], None]  # (counter, library, amount)


class Rederiver:
    """A trusted producer's loop: every POLL_SECONDS, each pending capture under the
    fingerprints of the scopes this node warmed, in a thread of its own, with the node's
    context (``open_shared`` opens each target's shared cache with it too)."""

    def __init__(self, scopes: list[CaptureScope],
                 open_shared: Callable[[Target], SharedCache | None], context: NodeContext,
                 on_count: CountCallback | None = None, poll_seconds: float = POLL_SECONDS,
                 on_result: Callable[[CaptureResult], None] | None = None) -> None:
        self.scopes, self.open_shared, self.context = scopes, open_shared, context
        self.on_count, self.on_result = on_count, on_result
        self.poll_seconds = poll_seconds
        self.results: list[CaptureResult] = []
        self._given_up: set[tuple[str, str]] = set()  # failed here once: not retried
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="warmd-rederive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        caches = self._caches()
        while not self._stop.is_set():
            try:
                self.run_once(caches)
            except Exception:  # never takes the agent down
                log.exception("re-derivation pass failed")
            self._stop.wait(self.poll_seconds)
        for shared, _adapter in caches:
            if shared is not None:
                shared.close()

    def _caches(self) -> list[tuple[SharedCache, CacheAdapter]]:
        out, seen = [], set()
        for scope in self.scopes:
            shared = self.open_shared(scope.target_object())
            if shared is None:
                continue
            for library, adapter in adapters_for(scope).items():
                key = (library, repr(sorted(scope.target.items())))
                if key not in seen:
                    seen.add(key)
                    out.append((shared, adapter))
        return out

    def run_once(self, caches: list[tuple[SharedCache, CacheAdapter]] | None = None
                 ) -> list[CaptureResult]:
        done = []
        for shared, adapter in caches if caches is not None else self._caches():
            skip = {n for lib, n in self._given_up if lib == adapter.library}
            for result in rederive_pending(shared, adapter, self.context, skip):
                if self._stop.is_set():
                    return done
                self._note(result)
                done.append(result)
        return done

    def _note(self, result: CaptureResult) -> None:
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)
        counter = {"rederived": "rederived", "refused": "rederive_refused",
                   "quarantined": "rederive_quarantined",
                   "failed": "capture_failed"}.get(result.outcome)
        if result.outcome == "failed" or (result.outcome == "kept"
                                          and result.why != "capture not readable now"):
            self._given_up.add((result.library, result.name))  # not retried by this process
        if result.outcome == "rederived":
            log.info("re-derived %s %s (%s)", result.library, result.name,
                     "identical" if result.identical else f"differs: {result.why}")
        elif result.outcome != "kept" or result.why:
            log.warning("re-derivation %s %s %s: %s", result.outcome, result.library,
                        result.name, result.why)
        if counter is not None and self.on_count is not None:
            self.on_count(counter, result.library, 1)
        if result.outcome == "rederived" and not result.identical and self.on_count:
            self.on_count("rederived_differs", result.library, 1)
