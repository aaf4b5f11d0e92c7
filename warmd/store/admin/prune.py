"""`warmd cache prune`: entries unused for a while (or every entry of chosen fingerprints),
used keys (the index) whose manifest is gone or that hold no time, task records naming
removed entries, and blob chunks no manifest references any more."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from warmd.store import layout
from warmd.store.admin.reads import (
    ANY_SIZE,
    delete_many,
    entries,
    fingerprint_meta,
    fingerprints,
    get_many,
    list_reply,
    scan,
    string_reply,
    wrong_types,
)
from warmd.store.formats import Manifest, StoredTaskRecord
from warmd.store.shared import StoreSharedCache
from warmd.store.validation import BadRecord, RefusedHere

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


def select_fingerprints(cache: StoreSharedCache, fps: Iterable[str] = (),
                        namespaces: Iterable[str] = ()) -> list[str]:
    """The fingerprints named, plus those whose inputs carry one of the namespaces."""
    wanted, spaces = list(fps), set(namespaces)
    known = fingerprints(cache)
    if spaces:
        meta = fingerprint_meta(cache, known)
        wanted += [fp for fp in known if meta[fp]["inputs"].get("namespace") in spaces]
    return list(dict.fromkeys(wanted))


def prune(cache: StoreSharedCache, *, older_than: float | None = None,
          selected: Iterable[str] = (), everything: bool = False,
          dry_run: bool = False) -> PruneReport:
    """Remove entries unused for older_than seconds (or every entry of the selected
    fingerprints with everything=True), and what only they kept alive."""
    report = PruneReport(dry_run)
    cutoff = time.time() - older_than if older_than is not None else None
    chosen = set(selected)
    report.malformed_removed += _remove_wrong_types(cache, dry_run)
    for fp in fingerprints(cache):
        doomed_fp = everything and fp in chosen
        in_scope = not chosen or fp in chosen
        removed, unindexed = [], []
        for item in entries(cache, fp):
            if item["raw"] is not None and not item["index_ok"]:
                report.malformed_removed += 1  # the entry stays; its next use indexes it
                unindexed.append(layout.used_key(fp, item["name"]))
            elif item["raw"] is None:
                report.stale_index += 1
                removed.append(item["name"])
            elif item["manifest"] is None and not isinstance(item["problem"],
                                                             RefusedHere):
                report.malformed_removed += 1  # garbage for every node: never kept
                removed.append(item["name"])
            elif in_scope and (doomed_fp or (cutoff is not None
                                             and (item["last_used"] or 0.0) < cutoff)):
                report.entries_removed += 1
                man = item["manifest"]
                report.bytes_removed += man.size if man else 0
                removed.append(item["name"])
        if not dry_run and (removed or unindexed):
            cache.backend.delete([*unindexed, *(k for name in removed for k in (
                layout.manifest_key(fp, name), layout.used_key(fp, name)))])
        report.task_records_removed += _prune_tasks(cache, fp, set(removed), doomed_fp,
                                                    dry_run)
        if doomed_fp:
            report.fingerprints_removed += 1
            if not dry_run:
                _remove_fingerprint(cache, fp)
    report.orphan_blobs_removed = _prune_blobs(cache, dry_run)
    return report


def _remove_wrong_types(cache: StoreSharedCache, dry_run: bool) -> int:
    """Delete the lists warmd keeps (stats' node list; the fingerprint list and indexes
    older warmd wrote) where they hold another Redis type: garbage nobody can read, which
    the next writes rebuild. Returns how many."""
    expected = {layout.FPS_KEY: "zset", layout.NODES_KEY: "string"}
    doomed = wrong_types(cache, expected, "prune")
    expected = {layout.index_key(fp): "zset" for fp in fingerprints(cache)}
    doomed += wrong_types(cache, expected, "prune")
    if doomed and not dry_run:
        cache.op(lambda c: delete_many(c, doomed), "prune")
    return len(doomed)


def _prune_tasks(cache: StoreSharedCache, fp: str, removed: set[str], everything: bool,
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


def _remove_fingerprint(cache: StoreSharedCache, fp: str) -> None:
    def run(client):
        pipe = client.pipeline(transaction=False)
        pipe.delete(layout.index_key(fp))
        pipe.delete(layout.fp_meta_key(fp))
        pipe.zrem(layout.FPS_KEY, fp)
        return [list_reply(r) for r in pipe.execute(raise_on_error=False)]

    cache.op(run, "prune")


def _referenced_digests(cache: StoreSharedCache) -> set[str]:
    """The blob digest of every manifest in the store, found by SCAN rather than through the
    fingerprint list and indexes (which a writer may have deleted or retyped: chunks that
    manifests still use must never look orphaned)."""
    keys = scan(cache, layout.manifest_keys_pattern(), "prune")
    digests = set()
    for at in range(0, len(keys), 1000):
        batch = keys[at:at + 1000]
        for reply in cache.op(lambda c, batch=batch: get_many(c, batch, strict=False), "prune"):
            raw = string_reply(reply)
            try:
                digests.add(Manifest.decode(raw, ANY_SIZE).digest)
            except BadRecord:
                continue
    return digests


def _prune_blobs(cache: StoreSharedCache, dry_run: bool) -> int:
    """Delete chunks of blobs that no manifest references (and that are old enough not to
    belong to a publication in flight). Returns how many blobs went."""
    referenced = _referenced_digests(cache)
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
