"""`warmd cache import`: an export archive read back, every item verified as a fetch
verifies it (manifest, signature, digest, artifact safety); refused items are counted and
skipped, an unsafe archive imports nothing."""

from __future__ import annotations

import tarfile
from pathlib import Path

from warmd.stats import CounterFlag, ids
from warmd.store import layout
from warmd.store.admin import archive
from warmd.store.admin.archive import UnsafeArchive
from warmd.store.admin.verify import unsafe_artifact
from warmd.store.chunking import verify_blob
from warmd.store.fingerprint import Fingerprint, digest_of
from warmd.store.formats import StoredTaskRecord
from warmd.store.shared import StoreSharedCache
from warmd.store.validation import BadRecord, RefusedHere


def import_archive(cache: StoreSharedCache, path: Path) -> dict:
    """{"imported", "already_present", "tasks", "tasks_skipped", and each refusal counter}.
    Raises UnsafeArchive (nothing written) when the archive itself is malformed or unsafe."""
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise UnsafeArchive(f"cannot read {path} as a tar archive: {exc}") from None
    with tar:
        found = archive.scan(tar, cache.max_artifact_bytes)
        archive.check_header(archive.json_member(tar, found["meta"][0]))
        blobs = {archive.member_fields("blob", m)[0]: m for m in found["blob"]}
        fps = {archive.member_fields("fp", m)[0]: archive.json_member(tar, m)
               for m in found["fp"]}
        counts = {"imported": 0, "already_present": 0, "tasks": 0, "tasks_skipped": 0,
                  **dict.fromkeys(ids(CounterFlag.REFUSAL), 0)}
        accepted: dict[str, set[str]] = {}
        for member in found["man"]:
            fp, name = archive.member_fields("man", member)
            if _import_entry(cache, tar, fp, name, member, fps.get(fp), blobs, counts):
                accepted.setdefault(fp, set()).add(name)
        for member in found["task"]:
            (fp,) = archive.member_fields("task", member)
            _import_task(cache, tar, fp, member, accepted.get(fp, set()), counts)
    cache.stats.flush()
    return counts


def _refuse(cache: StoreSharedCache, counts: dict, fp: str, what: str,
            problem: BadRecord) -> None:
    counts[problem.counter] += 1
    if isinstance(problem, RefusedHere):
        cache.refusals.refused_here(fp, what, str(problem))
    else:
        cache.refusals.reject(problem.counter, fp, what, str(problem))


def _import_entry(cache: StoreSharedCache, tar: tarfile.TarFile, fp: str, name: str,
                  member: tarfile.TarInfo, fp_meta: dict | None, blobs: dict,
                  counts: dict) -> bool:
    raw = tar.extractfile(member).read()
    try:
        man = cache.accept_manifest(raw, fp, name)
        if (fp_meta is None or fp_meta.get("digest") != fp
                or not isinstance(fp_meta.get("inputs"), dict)
                or digest_of(fp_meta["inputs"]) != fp):
            raise BadRecord("entry without its fingerprint, or a fingerprint that does not "
                            "match its inputs")
        if man.digest not in blobs:
            raise BadRecord("entry without its blob in the archive")
        blob = verify_blob(man, tar.extractfile(blobs[man.digest]).read())
        problem = unsafe_artifact(blob)
        if problem is not None:
            raise problem
    except BadRecord as exc:
        _refuse(cache, counts, fp, f"imported entry {name}", exc)
        return False
    fingerprint = Fingerprint(man.library, dict(fp_meta["inputs"]), fp)
    new = cache.publisher.write_entries(fingerprint, [(man, blob)])
    counts["imported" if new else "already_present"] += 1
    if new:
        cache.stats.count("imported", fp=fp)
    return True


def _import_task(cache: StoreSharedCache, tar: tarfile.TarFile, fp: str,
                 member: tarfile.TarInfo, accepted: set[str], counts: dict) -> None:
    raw = tar.extractfile(member).read()
    try:
        rec = cache.accept_record(raw, fp, StoredTaskRecord.decode(raw).task)
    except BadRecord as exc:
        _refuse(cache, counts, fp, "imported task record", exc)
        return
    if not set(rec.entries) <= accepted:  # it would only ever miss
        counts["tasks_skipped"] += 1
        return

    def run(client):
        return client.set(layout.task_key(fp, rec.task), raw, nx=True, px=cache.ttl_ms)

    if cache.op(run, "import"):
        counts["tasks"] += 1
