"""This node's record of each warmed task, and the digests that let a later run trust it.

A record per task, ``<cache root>/.warmd/tasks/<sha256 of task key>.json``, lists the entries
the task produced, what each took to compile, each entry's digest (``entry_digest``) and the
digest of the library's fingerprint inputs (``fingerprint_digest``). A later run counts a
task whose entries still match as hits without running the library (warmd.warmup); the
capture (warmd.capture) reads the records to tell planned entries from runtime JIT.

The fingerprint here covers what the adapter says its cache keys depend on (library version,
install path, arch...). The shared cache's fingerprint (warmd.store.fingerprint) starts from
the same inputs (``adapter_inputs``) and adds what only sharing depends on: target SMs, CUDA
driver major, toolkit, namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.cache.install import installed_digest

RECORD_DIR = ".warmd/tasks"  # under each cache root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalTaskRecord:
    """What a task produced on this node (named apart from the shared cache's task record,
    warmd.store.layout)."""

    task: str
    entries: dict[str, float] = field(default_factory=dict)  # entry -> compile seconds
    digests: dict[str, str] = field(default_factory=dict)  # entry -> entry_digest
    fingerprint: str | None = None  # fingerprint_digest when it was written
    # The entries this node compiled itself (the others it installed from the shared cache):
    # a later hit of one saved no compile time (warmd.stats.compile_seconds_saved).
    compiled: frozenset[str] = frozenset()

    def vouches_for(self, entries: Mapping[str, CacheEntry], fingerprint: str | None) -> bool:
        """Whether every entry is the one this record saw: same fingerprint, same bytes."""
        if self.fingerprint is None or self.fingerprint != fingerprint:
            return False
        return all(self.digests.get(name) is not None
                   and self.digests[name] == entry_digest(entry.path)
                   for name, entry in entries.items())

    def to_json(self) -> dict:
        return {"task": self.task, "entries": self.entries, "digests": self.digests,
                "fingerprint": self.fingerprint, "compiled": sorted(self.compiled)}


def learned_record_key(plan_key: str) -> str:
    """The key of this node's record of the entries learned for a plan and installed here
    (warmd.capture.sharing.install_learned), one per library's cache."""
    return f"learned-for-plan:{plan_key}"


def record_path(root: Path, task_key: str) -> Path:
    return root / RECORD_DIR / f"{hashlib.sha256(task_key.encode()).hexdigest()}.json"


def read_record(root: Path, task_key: str) -> LocalTaskRecord:
    """The task's record; an empty one when it is missing or damaged (a damaged part reads
    as absent: a record only ever saves work, never decides a failure)."""
    try:
        data = json.loads(record_path(root, task_key).read_text())
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return LocalTaskRecord(task_key)
    return LocalTaskRecord(task_key, _entries(data.get("entries")),
                           _digests(data.get("digests")),
                           data["fingerprint"] if isinstance(data.get("fingerprint"), str)
                           else None, _names(data.get("compiled")))


def _entries(value: object) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in value.items()}  # type: ignore[union-attr]
    except (ValueError, TypeError, AttributeError):
        return {}


def _names(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str))


def _digests(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def write_record(root: Path, record: LocalTaskRecord) -> bool:
    """Write the record atomically; False (logged) when the disk refuses: a record only
    improves later counts, so it never fails the task."""
    path = record_path(root, record.task)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as handle:
            json.dump(record.to_json(), handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("cannot write the task record %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def recorded_entries(root: Path) -> set[str]:
    """Every entry a task record under this cache root names (what warmups produced here)."""
    names: set[str] = set()
    for path in (root / RECORD_DIR).glob("*.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            names.update(json.loads(path.read_text()).get("entries", {}))
    return names


def entry_digest(path: Path) -> str | None:
    """sha256 over an entry's regular files (relative path and bytes, in name order);
    None when it holds anything else or cannot be read. An entry this process has just
    installed, unchanged since, is not read again (warmd.cache.install.installed_digest)."""
    known = installed_digest(path)
    if known is not None:
        return known
    digest = hashlib.sha256()
    try:
        files = sorted(p for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
        for file in files:
            if file.is_symlink() or not file.is_file():
                return None
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
            digest.update(file.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()


def adapter_inputs(adapter: CacheAdapter) -> dict:
    """What the adapter says its cache keys depend on, as JSON reads it back (values JSON
    cannot hold as their text); raises what the adapter's probe raises."""
    return json.loads(json.dumps(dict(adapter.fingerprint_inputs()), default=str))


def fingerprint_digest(adapter: CacheAdapter) -> str | None:
    """Digest of the adapter's inputs: entries recorded under another one may not hit here.
    None when the adapter cannot say (nothing on record can then be trusted)."""
    try:
        inputs = adapter_inputs(adapter)
    except Exception as exc:  # a probe that fails: nothing on record can be trusted
        log.warning("cannot work out the %s fingerprint: %s", adapter.library, exc)
        return None
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
