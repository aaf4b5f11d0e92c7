"""Sharing what a capture found: each entry verified (packed, the archive checked), then
stored as a pending capture or published as a learned entry of every plan it serves; learned
entries installed and recorded on the nodes that warm a plan, and listed with the planner
rule that missed them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warmd import settings
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.records import (
    LocalTaskRecord,
    entry_digest,
    fingerprint_digest,
    learned_record_key,
    write_record,
)

if TYPE_CHECKING:
    from warmd.store.api import SharedCache

LEARNED = "learned"


def learned_task(plan_key: str, entry: str) -> str:
    """The task key a learned entry is published under (one record per entry)."""
    return f"{LEARNED}:{plan_key}:{entry}"


def missed_by(library: str) -> str:
    """Which planner rule would have missed a learned entry of this library."""
    from warmd.libraries import LIBRARIES

    registered = LIBRARIES.get(library)
    if registered is None:
        return f"{library}: not a library this warmd knows"
    if not registered.plugin().plans_tasks:
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
    names = shared.lists.learned(adapter, plan_key)
    if not names:
        return []
    fetched = shared.entries.prefetch(adapter, [learned_task(plan_key, n) for n in names])
    present = sorted({n for got in fetched.values() if got for n in got})
    record_learned(adapter, plan_key, present)
    return present


def record_learned(adapter: CacheAdapter, plan_key: str, names: list[str]) -> None:
    """This node's record of what was learned for the plan and installed here, so that
    `warmd verify` can say whether the engine will find each entry."""
    if not names:
        return
    complete = {e.name: e for e in adapter.list_entries()}
    digests = {n: d for n in names if n in complete
               and (d := entry_digest(complete[n].path)) is not None}
    write_record(adapter.root, LocalTaskRecord(learned_record_key(plan_key),
                                               dict.fromkeys(names, 0.0), digests,
                                               fingerprint_digest(adapter)))


def verify_for_publishing(adapter: CacheAdapter, entry: CacheEntry) -> str | None:
    """Why an entry must not be shared (None: it may): packing refuses incomplete entries
    and links, the archive check refuses traversal, devices and oversize."""
    try:
        verified_artifact(adapter, entry)
    except UnsafeArtifact as exc:
        return str(exc)
    return None


def publish_learned(shared: SharedCache, adapter: CacheAdapter, plan_keys: list[str],
                    entries: list[CacheEntry], seconds: float = 0.0) -> list[str]:
    """Publish verified entries as learned entries of each plan (signed when signing is
    on); returns the names the store took (published now or by another node before). Only
    a trusted producer calls this (warmd.rederive), or a capture whose cluster trusts its
    own nodes."""
    taken = []
    for entry in entries:
        done = [shared.entries.publish_task(adapter, learned_task(plan, entry.name), [entry],
                                            seconds)
                for plan in plan_keys]
        if any(publication.stored for publication in done):
            taken.append(entry.name)
    if taken:
        for plan in plan_keys:
            shared.lists.add_learned(adapter, plan, taken)
    return taken


def submit_captures(shared: SharedCache, adapter: CacheAdapter, plan_keys: list[str],
                  artifacts: dict[str, bytes]) -> list[str]:
    """Store verified entries' artifacts as pending captures (unsigned, installed by no
    node); returns the names the store took."""
    return [name for name, artifact in artifacts.items()
            if shared.captures.submit(adapter, plan_keys, name, artifact)]


def verified_artifact(adapter: CacheAdapter, entry: CacheEntry) -> bytes:
    """The entry's artifact if it may be shared; raises UnsafeArtifact (never shared) or
    OSError/ValueError (changed while packing)."""
    from warmd.cache.install import check_artifact

    artifact = adapter.pack(entry)
    check_artifact(artifact, settings.max_artifact_bytes())
    return artifact
