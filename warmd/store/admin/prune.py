"""`warmd cache prune`: entries unused for a while (or every entry of chosen fingerprints),
index members whose manifest is gone, task records naming removed entries, and blob chunks
no manifest references any more."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from warmd.store import layout
from warmd.store.admin.reads import (
    delete_many,
    entries,
    fingerprint_meta,
    fingerprints,
    get_many,
    scan,
    string_reply,
)
from warmd.store.layout import BadRecord, StoredTaskRecord
from warmd.store.redis_store import RedisSharedCache

ORPHAN_GRACE_MS = 10 * 60 * 1000  # chunks younger than this may belong to a publish in flight


@dataclass
class PruneReport:
    dry_run: bool
    entries_removed: int = 0
    bytes_removed: int = 0
    stale_index: int = 0
    malformed_removed: int = 0  # undecodable manifests (or keys of another type)
    task_records_removed: int = 0
    fingerprints_removed: int = 0
    orphan_blobs_removed: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def select_fingerprints(cache: RedisSharedCache, fps: Iterable[str] = (),
                        namespaces: Iterable[str] = ()) -> list[str]:
    """The fingerprints named, plus those whose inputs carry one of the namespaces."""
    wanted, spaces = list(fps), set(namespaces)
    known = fingerprints(cache)
    if spaces:
        meta = fingerprint_meta(cache, known)
        wanted += [fp for fp in known if meta[fp]["inputs"].get("namespace") in spaces]
    return list(dict.fromkeys(wanted))


def prune(cache: RedisSharedCache, *, older_than: float | None = None,
          selected: Iterable[str] = (), everything: bool = False,
          dry_run: bool = False) -> PruneReport:
    """Remove entries unused for older_than seconds (or every entry of the selected
    fingerprints with everything=True), and what only they kept alive."""
    report = PruneReport(dry_run)
    cutoff = time.time() - older_than if older_than is not None else None
    chosen = set(selected)
    for fp in fingerprints(cache):
        doomed_fp = everything and fp in chosen
        in_scope = not chosen or fp in chosen
        removed = []
        for item in entries(cache, fp):
            if item["raw"] is None:
                report.stale_index += 1
                removed.append(item["name"])
            elif item["manifest"] is None and not isinstance(item["problem"],
                                                             layout.RefusedHere):
                report.malformed_removed += 1  # garbage for every node: never kept
                removed.append(item["name"])
            elif in_scope and (doomed_fp or (cutoff is not None
                                             and item["last_used"] < cutoff)):
                report.entries_removed += 1
                man = item["manifest"]
                report.bytes_removed += man.size if man else 0
                removed.append(item["name"])
        if not dry_run and removed:
            _remove_entries(cache, fp, removed)
        report.task_records_removed += _prune_tasks(cache, fp, set(removed), doomed_fp,
                                                    dry_run)
        if doomed_fp:
            report.fingerprints_removed += 1
            if not dry_run:
                _remove_fingerprint(cache, fp)
    report.orphan_blobs_removed = _prune_blobs(cache, dry_run)
    return report


def _remove_entries(cache: RedisSharedCache, fp: str, names: list[str]) -> None:
    def run(client):
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.delete(layout.manifest_key(fp, name))
        pipe.zrem(layout.index_key(fp), *names)
        return pipe.execute()

    cache.op(run, "prune")


def _prune_tasks(cache: RedisSharedCache, fp: str, removed: set[str], everything: bool,
                 dry_run: bool) -> int:
    if not removed and not everything:
        return 0
    keys = scan(cache, layout.task_keys_pattern(fp), "prune")
    if not keys:
        return 0
    raws = cache.op(lambda c: get_many(c, keys, strict=False), "prune")
    doomed = []
    for key, reply in zip(keys, raws, strict=True):
        raw = string_reply(reply)
        try:
            names = set(StoredTaskRecord.decode(raw).entries) if raw is not None else set()
        except BadRecord:
            names = removed  # malformed: remove it too
        if everything or names & removed:
            doomed.append(key)
    if doomed and not dry_run:
        cache.op(lambda c: delete_many(c, doomed), "prune")
    return len(doomed)


def _remove_fingerprint(cache: RedisSharedCache, fp: str) -> None:
    def run(client):
        pipe = client.pipeline(transaction=False)
        pipe.delete(layout.index_key(fp))
        pipe.delete(layout.fp_meta_key(fp))
        pipe.zrem(layout.FPS_KEY, fp)
        return pipe.execute()

    cache.op(run, "prune")


def _prune_blobs(cache: RedisSharedCache, dry_run: bool) -> int:
    """Delete chunks of blobs that no manifest references (and that are old enough not to
    belong to a publication in flight). Returns how many blobs went."""
    referenced = {item["manifest"].digest for fp in fingerprints(cache)
                  for item in entries(cache, fp) if item["manifest"]}
    orphans: dict[str, list] = {}
    for key in cache.op(lambda c: list(c.scan_iter(match=layout.blob_keys_pattern(),
                                                   count=1000)), "prune"):
        digest = layout.parse_blob_key(key)
        if digest and digest not in referenced:
            orphans.setdefault(digest, []).append(key)
    if not orphans:
        return 0
    keys = [k for ks in orphans.values() for k in ks]

    def ages(client):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        return pipe.execute()

    ttls = dict(zip(keys, cache.op(ages, "prune"), strict=True))
    young = cache.ttl_ms - ORPHAN_GRACE_MS
    old = [d for d, ks in orphans.items() if all(ttls[k] < young for k in ks)]
    if old and not dry_run:
        cache.op(lambda c: delete_many(c, [k for d in old for k in orphans[d]]), "prune")
    return len(old)
