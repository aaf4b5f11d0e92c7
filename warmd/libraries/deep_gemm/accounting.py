"""What a DeepGEMM task's calls did, from what DeepGEMM printed: with DG_JIT_PRINT_LOAD_TIME
set it prints "Load time (<entry dir>): ..." each time this process loads a kernel, and the
process's stdout is captured around every call (``StdoutCapture``), so each loaded entry
belongs to the call that loaded it (``Accounting``); the entries of the task's GEMM type
that appear in cache/ during its calls are the fallback."""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from warmd.cache.base import CacheEntry
from warmd.executors.base import KernelOutcome
from warmd.libraries.deep_gemm.cache import LIBRARY, DeepGemmCacheAdapter, entry_state
from warmd.libraries.deep_gemm.gemms import GemmSpec

_LOAD_LINE = re.compile(r"^Load time \((?P<path>.+)\): [0-9.]+ ms\s*$")


def loaded_entries(printed: str) -> tuple[list[Path], str]:
    """Entry directories DeepGEMM reported loading, and the rest of what it printed."""
    loads, rest = [], []
    for line in printed.splitlines(keepends=True):
        match = _LOAD_LINE.match(line.strip())
        if match:
            loads.append(Path(match.group("path")))
        else:
            rest.append(line)
    return loads, "".join(rest)


class StdoutCapture:
    """What C/C++ code prints to this process's stdout (fd 1) between start() and stop()."""

    def __init__(self, buffer) -> None:
        self._libc = ctypes.CDLL(None)
        self._file = buffer  # a binary temporary file
        self._saved: int | None = None

    def start(self) -> None:
        sys.stdout.flush()
        self._libc.fflush(None)
        self._saved = os.dup(1)
        os.dup2(self._file.fileno(), 1)

    def stop(self) -> str:
        self._libc.fflush(None)
        if self._saved is not None:
            os.dup2(self._saved, 1)
            os.close(self._saved)
            self._saved = None
        self._file.seek(0)
        data = self._file.read()
        self._file.seek(0)
        self._file.truncate()
        return data.decode(errors="replace")


# Once DeepGEMM printed a load line in this process, its silence means "no load".
_loads_seen = False


@dataclass
class Accounting:
    """Per-task outcomes: loads DeepGEMM reported per call, plus the scan fallback."""

    adapter: DeepGemmCacheAdapter
    spec: GemmSpec
    known: set[str] = field(default_factory=set)  # complete entries of cache/
    outcomes: dict[str, KernelOutcome] = field(default_factory=dict)
    appeared: list[KernelOutcome] = field(default_factory=list)  # fallback: scan of cache/

    def start(self) -> None:
        self.known = set()
        self._refresh()

    def after_call(self, printed: str, seconds: float) -> None:
        """Classify what the call loaded (against the entries complete before it), then
        note what appeared in cache/ during it."""
        global _loads_seen
        loads, rest = loaded_entries(printed)
        if rest:
            os.write(1, rest.encode())  # DeepGEMM's other output stays in the log
        for path in loads:
            _loads_seen = True
            name = path.name
            if name in self.outcomes:
                continue
            # Not complete in cache/ before this call (or loaded from anywhere else, which
            # only a DG_JIT_CACHE_DIR changed behind warmd's back can cause): compiled.
            mine = name not in self.known or path.parent != self.adapter.entries_dir
            self.outcomes[name] = KernelOutcome(name, "compiled" if mine else "local_hit",
                                                round(seconds, 3) if mine else 0.0)
        for name in self._refresh():
            source = self.adapter.source(CacheEntry(LIBRARY, name, self.adapter.entries_dir
                                                    / name))
            # Not another GEMM type's kernel (layout helpers such as transpose_fp32 name
            # no GemmType): count it, as this task's calls may have built it.
            if source is None or source.gemm_type in (None, self.spec.gemm_type):
                self.appeared.append(KernelOutcome(name, "compiled", round(seconds, 3)))

    def _refresh(self) -> list[str]:
        """Entries that became complete since the last look (an incomplete one is looked at
        again next time)."""
        fresh = [name for name in self.adapter.entry_names() - self.known
                 if entry_state(self.adapter.entries_dir / name) == "complete"]
        self.known.update(fresh)
        return sorted(fresh)

    def result(self) -> list[KernelOutcome]:
        return list(self.outcomes.values()) if _loads_seen else list(self.appeared)
