"""`warmd cache export`: verified entries, their fingerprints and task records to a tar
archive (warmd.store.admin.archive), written atomically."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable
from pathlib import Path

from warmd.store import layout
from warmd.store.admin import archive
from warmd.store.admin.reads import (
    accepted,
    entries,
    fingerprint_meta,
    fingerprints,
    get_many,
    scan,
)
from warmd.store.chunking import size_batches
from warmd.store.formats import StoredTaskRecord
from warmd.store.shared import StoreSharedCache
from warmd.store.validation import BadRecord


def export_archive(cache: StoreSharedCache, path: Path, selected: Iterable[str] = ()) -> dict:
    """{"fingerprints", "entries", "tasks", "bytes", "skipped"} written to path."""
    fps = list(selected) or fingerprints(cache)
    meta = fingerprint_meta(cache, fps)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    counts = {"fingerprints": 0, "entries": 0, "tasks": 0, "bytes": 0, "skipped": 0}
    try:
        _write(cache, tmp, fps, meta, counts)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return counts


def _write(cache: StoreSharedCache, tmp: Path, fps: list[str], meta: dict,
           counts: dict) -> None:
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        archive.add(tar, archive.HEADER, archive.header(cache.display_url))
        for fp in fps:
            if meta[fp].get("malformed"):  # an import could not check its entries anyway
                counts["skipped"] += meta[fp]["entries"]
                continue
            counts["fingerprints"] += 1
            archive.add(tar, archive.member_name("fp", fp), json.dumps(
                {"library": meta[fp]["library"], "digest": fp,
                 "inputs": meta[fp]["inputs"]}).encode())
            exported = _export_entries(cache, tar, fp, counts)
            _export_tasks(cache, tar, fp, exported, counts)


def _export_entries(cache: StoreSharedCache, tar: tarfile.TarFile, fp: str,
                    counts: dict) -> set[str]:
    good = []
    for item in entries(cache, fp):
        try:
            man = accepted(cache, fp, item)
        except BadRecord:
            man = None
        if man is None:
            counts["skipped"] += 1
            continue
        good.append((man, item["raw"]))
    exported, blobs_done = set(), set()
    for batch in size_batches(good):
        blobs = cache.blobs.read_blobs([m for m, _ in batch])
        for man, raw in batch:
            blob = blobs[man.digest]
            if isinstance(blob, BadRecord):
                counts["skipped"] += 1
                continue
            if man.digest not in blobs_done:
                archive.add(tar, archive.member_name("blob", man.digest), blob)
                blobs_done.add(man.digest)
                counts["bytes"] += len(blob)
            archive.add(tar, archive.member_name("man", fp, man.name), raw)
            exported.add(man.name)
            counts["entries"] += 1
    return exported


def _export_tasks(cache: StoreSharedCache, tar: tarfile.TarFile, fp: str, exported: set[str],
                  counts: dict) -> None:
    keys = scan(cache, layout.task_keys_pattern(fp), "export")
    raws = cache.op(lambda c: get_many(c, keys, strict=False), "export") if keys else []
    for raw in raws:
        if raw is None or isinstance(raw, Exception):  # gone, or not a string (WRONGTYPE)
            continue
        try:
            rec = StoredTaskRecord.decode(raw)
        except BadRecord:
            continue
        if set(rec.entries) <= exported:
            archive.add(tar, archive.member_name("task", fp, rec.task), raw)
            counts["tasks"] += 1
