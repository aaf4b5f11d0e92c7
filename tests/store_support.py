"""Shared pieces of the shared-cache tests: a real server per test, a small real adapter.

`DirAdapter` is a complete CacheAdapter for a test library whose entries are directories of
real files (packed and installed by warmd.cache.artifacts, like the real adapters); its
"compile" writes an entry of a realistic size and logs the compile to a file, so tests can
count compiles across processes. The server is a real redis-server started on a free port.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from warmd.cache.artifacts import install_atomically, pack_directory
from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.store import ServerProcess, start_server

SRC = str(Path(__file__).resolve().parent.parent)


class DirAdapter(CacheAdapter):
    library = "testlib"

    def __init__(self, root: Path, version: str = "1.0") -> None:
        self._root = Path(root)
        self.version = version

    @property
    def root(self) -> Path:
        return self._root

    def list_entries(self) -> list[CacheEntry]:
        if not self._root.is_dir():
            return []
        return [CacheEntry(self.library, p.name, p) for p in sorted(self._root.iterdir())
                if p.is_dir() and not p.name.startswith(".") and (p / "done").exists()]

    def pack(self, entry: CacheEntry) -> bytes:
        return pack_directory(entry.path)

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        self._root.mkdir(parents=True, exist_ok=True)
        return CacheEntry(self.library, name,
                          install_atomically(self._root, name, artifact).path)

    def fingerprint_inputs(self) -> dict:
        return {"version": self.version, "arch": "9.0a", "sms": 132}


def entry_bytes(name: str, size: int) -> bytes:
    """Incompressible, deterministic content for an entry (like a cubin)."""
    out = bytearray()
    seed = name.encode()
    while len(out) < size:
        seed = hashlib.sha256(seed).digest()
        out += seed
    return bytes(out[:size])


def compile_entry(adapter: DirAdapter, name: str, size: int = 120_000,
                  log: Path | None = None, seconds: float = 0.0) -> CacheEntry:
    """The test library's 'compiler': writes the entry, then its completion marker; logs
    'start NAME' and 'done NAME' lines (with its pid) so tests can count compiles."""
    _log(log, "start", name)
    if seconds:
        time.sleep(seconds)
    path = adapter.root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "kernel.bin").write_bytes(entry_bytes(name, size))
    (path / "done").write_text("ok")
    _log(log, "done", name)
    return CacheEntry(adapter.library, name, path)


def _log(log: Path | None, what: str, name: str) -> None:
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {what} {name}\n")


def compiles(log: Path, what: str = "done") -> list[str]:
    """Entry names compiled (or started) according to a compile log."""
    if not log.exists():
        return []
    return [line.split()[2] for line in log.read_text().splitlines() if line.split()[1] == what]


def warm(cache, adapter: DirAdapter, plan: dict[str, list[str]], log: Path | None = None,
         seconds: float = 0.0, timeout: float = 60.0, size: int = 120_000) -> dict:
    """Warm a plan {task: [entry names]} the way warmup drives a SharedCache: fetch, else
    single-flight compile and publish. Returns counts of what happened."""
    counts = {"local_hits": 0, "remote_hits": 0, "compiled": 0}
    present = {e.name for e in adapter.list_entries()}
    for task in cache.shard_order(sorted(plan)):
        names = plan[task]
        if all(n in present for n in names):
            counts["local_hits"] += len(names)
            continue
        if cache.fetch_task(adapter, task) is not None:
            counts["remote_hits"] += len(names)
            continue
        with cache.single_flight(task, timeout) as mine:
            if not mine and cache.fetch_task(adapter, task) is not None:
                counts["remote_hits"] += len(names)
                continue
            start = time.monotonic()
            entries = [compile_entry(adapter, n, size, log, seconds) for n in names]
            counts["compiled"] += len(entries)
            cache.publish_task(adapter, task, entries, time.monotonic() - start)
    cache.record_outcomes(counts)
    return counts


def make_plan(tasks: int, per_task: int = 2, prefix: str = "k") -> dict[str, list[str]]:
    return {f"testlib/gemm/{t}": [f"kernel.{prefix}{t}_{i}.{t:04x}{i:04x}"
                                  for i in range(per_task)] for t in range(tasks)}


def start_test_server(tmp: Path, **kw) -> ServerProcess:
    return start_server(tmp / "redis", appendonly=kw.pop("appendonly", False), **kw)


def run_worker(args: dict) -> list[str]:
    """argv for a worker process running tests/store_worker.py with JSON args."""
    return [sys.executable, str(Path(__file__).with_name("store_worker.py")), json.dumps(args)]
