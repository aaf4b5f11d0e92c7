"""Whether the engine, started in this environment, will compile anything: every planned
task and every entry learned for the plan, looked up in the directories the engine will read
(the plan's ``cache_dirs``), by the key its library computes.

A task is a hit when each entry on this node's record of it is complete where the engine
reads, has the bytes the record saw and was recorded under the fingerprint the library here
computes (its version, install path, arch: what DeepGEMM's and FlashInfer's keys and
Triton's cache key depend on); that is the warmup's own check (warmd.warmup.task.check).
A FlashInfer module must also be one its build() would not touch: ninja, run at this very
path, finds nothing to do. Entries learned for the plan (captured where an engine compiled
them, installed here by the daemon) are on a record of their own per library
(``learned_record_key``) and checked the same way.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from warmd.cache.base import CacheAdapter
from warmd.cache.records import (
    LocalTaskRecord,
    fingerprint_digest,
    learned_record_key,
    read_record,
)
from warmd.errors import WarmdInputError
from warmd.plan import Plan
from warmd.warmup.options import WarmupOptions
from warmd.warmup.state import RunState, TaskState
from warmd.warmup.task import check


@dataclass(frozen=True)
class Verdict:
    """One planned task (or one library's learned entries): will the engine hit it?"""

    key: str
    library: str
    hit: bool
    missing: tuple[str, ...] = ()  # entries the engine would compile (or the task itself)
    reason: str = ""

    def to_json(self) -> dict:
        return {"key": self.key, "library": self.library, "hit": self.hit,
                "missing": list(self.missing), "reason": self.reason}


@dataclass(frozen=True)
class VerifyReport:
    plan_key: str
    engine: str
    cache_dirs: dict[str, str]
    verdicts: tuple[Verdict, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """Nothing will compile."""
        return all(v.hit for v in self.verdicts)

    def misses(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.hit]

    def to_json(self) -> dict:
        return {"ok": self.ok, "plan_key": self.plan_key, "engine": self.engine,
                "cache_dirs": self.cache_dirs, "checked": len(self.verdicts),
                "missing": len(self.misses()),
                "verdicts": [v.to_json() for v in self.verdicts]}


def verify_plan(plan: Plan) -> VerifyReport:
    """Each task of the plan, and what was learned for it, checked where the engine reads."""
    options = WarmupOptions().for_plan(plan)
    dirs = plan.dirs()
    run = RunState(plan, options, None, list(plan.tasks))
    for name, state in run.libraries.items():
        if state.adapter is not None:
            check_readable(name, state.adapter.root)
    verdicts = [_task_verdict(run, state) for state in run.tasks]
    verdicts += _learned_verdicts(plan, options)
    return VerifyReport(plan.key, dirs.engine, dirs.to_json(), tuple(verdicts))


def check_readable(library: str, directory: Path) -> None:
    """A cache directory that is missing is empty (everything compiles); one that is there
    but cannot be listed is bad input: the engine could not read it either."""
    try:
        os.listdir(directory)
    except FileNotFoundError:
        return
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise WarmdInputError(f"{library} cache {directory} cannot be read: {why}") from None


def _task_verdict(run: RunState, state: TaskState) -> Verdict:
    task, adapter = state.task, state.library.adapter
    if adapter is None:
        return Verdict(task.key, task.library, False, (task.key,),
                       f"{task.library} is not installed here: the engine cannot load it")
    if check(run, state) is None:
        return _miss(task.key, task.library, adapter, state.record,
                     state.library.fingerprint(), task.module)
    stale = _stale_modules(adapter, state.record.entries)
    if stale:
        return Verdict(task.key, task.library, False, tuple(n for n, _ in stale),
                       "; ".join(f"{n}: {why}" for n, why in stale))
    return Verdict(task.key, task.library, True)


def _miss(key: str, library: str, adapter: CacheAdapter, record: LocalTaskRecord,
          fingerprint: str | None, name: str | None = None) -> Verdict:
    """Why a record does not vouch for its entries here, naming the entries."""
    if not record.entries:
        return Verdict(key, library, False, (name or key,),
                       f"never warmed into {adapter.root} (no record of it there)")
    complete = {e.name for e in adapter.list_entries()}
    absent = tuple(sorted(set(record.entries) - complete))
    if absent:
        return Verdict(key, library, False, absent, f"missing or incomplete in {adapter.root}")
    if record.fingerprint != fingerprint:
        return Verdict(key, library, False, tuple(sorted(record.entries)),
                       "warmed by another library install or version (its key differs here)")
    return Verdict(key, library, False, tuple(sorted(record.entries)),
                   "changed since warmed (its bytes differ from the record's)")


def _stale_modules(adapter: CacheAdapter, names) -> list[tuple[str, str]]:
    """Entries the library would rebuild at this path (FlashInfer modules: ninja -n)."""
    stale = []
    for name in sorted(names):
        ok, why = adapter.is_up_to_date(name)
        if not ok:
            stale.append((name, f"ninja would rebuild it here: {why}"))
    return stale


def _learned_verdicts(plan: Plan, options: WarmupOptions) -> list[Verdict]:
    """The entries learned for the plan that the daemon installed here, per library."""
    from warmd.libraries import LIBRARIES

    verdicts = []
    key = learned_record_key(plan.key)
    for name, library in LIBRARIES.items():
        adapter = library.make_adapter(options.cache_roots[name], plan.env.target.arch,
                                       plan.dirs()) \
            if Path(options.cache_roots[name]).exists() else None
        if adapter is None:
            continue
        record = read_record(adapter.root, key)
        if not record.entries:
            continue
        check_readable(name, adapter.root)
        fingerprint = fingerprint_digest(adapter)
        complete = {e.name: e for e in adapter.list_entries()}
        present = {n: complete[n] for n in record.entries if n in complete}
        if len(present) == len(record.entries) and record.vouches_for(present, fingerprint):
            stale = _stale_modules(adapter, record.entries)
            verdicts.append(Verdict(f"{key}:{name}", name, not stale,
                                    tuple(n for n, _ in stale),
                                    "; ".join(f"{n}: {why}" for n, why in stale)))
        else:
            verdicts.append(_miss(f"{key}:{name}", name, adapter, record, fingerprint))
    return verdicts
