"""testlib's cache: an entry is a directory of real files, complete once its `done`
marker is written; packed and installed by warmd.cache.packing and install like the real adapters.
Its 'compiler' writes an entry of a realistic size and logs each compile to a file, so tests
can count compiles across processes."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.cache.install import install_atomically
from warmd.cache.packing import pack_directory

DEFAULT_SIZE = 120_000


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


def make_adapter(root: Path, arch: str) -> DirAdapter:
    """Its plugin's adapter factory (root, target arch)."""
    return DirAdapter(root)


def entry_bytes(name: str, size: int) -> bytes:
    """Incompressible, deterministic content for an entry (like a cubin)."""
    out = bytearray()
    seed = name.encode()
    while len(out) < size:
        seed = hashlib.sha256(seed).digest()
        out += seed
    return bytes(out[:size])


def compile_entry(adapter: DirAdapter, name: str, size: int = DEFAULT_SIZE,
                  log: Path | None = None, seconds: float = 0.0) -> CacheEntry:
    """The library's 'compiler': writes the entry, then its completion marker; logs
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
