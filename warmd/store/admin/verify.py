"""`warmd cache verify`: every entry checked as a fetch would check it (manifest, signature,
chunks, digest) plus the archive's safety; what is corrupt optionally quarantined."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from warmd import settings
from warmd.cache.base import UnsafeArtifact
from warmd.cache.install import check_artifact
from warmd.store.admin.reads import entries, fingerprints
from warmd.store.chunking import size_batches
from warmd.store.entries import unpacks_over
from warmd.store.shared import StoreSharedCache
from warmd.store.validation import BadRecord, RefusedHere, SignatureRefused


@dataclass
class VerifyReport:
    checked: int = 0
    ok: int = 0
    bad: list[dict] = field(default_factory=list)
    quarantined: int = 0

    def to_json(self) -> dict:
        return {"checked": self.checked, "ok": self.ok, "bad": self.bad,
                "quarantined": self.quarantined}


def verify(cache: StoreSharedCache, selected: Iterable[str] = (),
           quarantine: bool = False) -> VerifyReport:
    """Check every entry (of the selected fingerprints); with quarantine, move aside what
    is corrupt (never what is only unsigned, or what this node alone cannot use)."""
    report = VerifyReport()
    for fp in list(selected) or fingerprints(cache):
        items = [i for i in entries(cache, fp) if i["raw"] is not None]
        report.checked += len(items)
        good = []
        for item in items:
            try:
                good.append((cache.accept_manifest(item["raw"], fp, item["name"]), item["raw"]))
            except BadRecord as exc:
                _bad(cache, report, fp, item["name"], item["raw"], exc, quarantine)
        for batch in size_batches(good):
            blobs = cache.blobs.read_blobs([m for m, _ in batch])
            for man, raw in batch:
                blob = blobs[man.digest]
                problem = blob if isinstance(blob, BadRecord) else unsafe_artifact(blob)
                if problem is None:
                    report.ok += 1
                else:
                    _bad(cache, report, fp, man.name, raw, problem, quarantine)
    return report


def unsafe_artifact(blob: bytes) -> BadRecord | None:
    """Why a verified blob must not be installed on this node (None: it may)."""
    limit = settings.max_artifact_bytes()
    if unpacks_over(blob, limit):
        return RefusedHere(f"unpacks to more than this node's {limit}-byte limit")
    try:
        check_artifact(blob, limit)
    except UnsafeArtifact as exc:
        problem = BadRecord(f"unsafe artifact: {exc}")
        problem.counter = "unsafe_rejected"
        return problem
    return None


def _bad(cache: StoreSharedCache, report: VerifyReport, fp: str, name: str, raw: bytes,
         problem: BadRecord, quarantine: bool) -> None:
    report.bad.append({"fingerprint": fp, "name": name, "reason": str(problem),
                       "kind": problem.counter})
    if quarantine and not isinstance(problem, (SignatureRefused, RefusedHere)):
        if cache.refusals.quarantine(fp, name, raw, str(problem), counter=problem.counter):
            report.quarantined += 1
    elif isinstance(problem, RefusedHere):
        cache.refusals.refused_here(fp, name, str(problem))
    else:
        cache.stats.count_refusal(problem.counter, fp)
