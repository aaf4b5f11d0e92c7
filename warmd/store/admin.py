"""Operator views and maintenance of the shared cache: ls, stats, verify, prune, export, import.

Everything here runs through a RedisSharedCache's parts (its transport, entries, publisher
and stats: same connection, timeouts and verification as warmup's fetch) but lets store
errors surface as StoreFailed: an operator asked.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import check_artifact
from warmd.cache.base import UnsafeArtifact
from warmd.stats import F, hit_rate, ids
from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import classify
from warmd.store.entries import unpacks_over
from warmd.store.fingerprint import Fingerprint, digest_of
from warmd.store.layout import BadRecord, Manifest
from warmd.store.redis_store import RedisSharedCache

EXPORT_FORMAT = "warmd-cache-export"
ORPHAN_GRACE_MS = 10 * 60 * 1000  # chunks younger than this may belong to a publish in flight
# Listing and pruning read every manifest whatever this node's own size limit: an entry too
# large to install here is still an entry (and its chunks are still referenced).
ANY_SIZE = 1 << 62


class UnsafeArchive(ValueError):
    """An export archive that must not be imported (traversal, links, unknown members)."""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _counters(raw: dict) -> dict[str, float]:
    out = {}
    for key, value in raw.items():
        name = _text(key)
        try:
            number = float(value)
        except ValueError:
            continue
        out[name] = int(number) if number.is_integer() and name != "last_seen" else number
    return out


# --------------------------------------------------------------------------- listing

def fingerprints(cache: RedisSharedCache) -> list[str]:
    pairs = cache.transport.op(lambda c: c.zrange(layout.FPS_KEY, 0, -1), "ls")
    return [_text(fp) for fp in pairs]


def fingerprint_meta(cache: RedisSharedCache, fps: list[str]) -> dict[str, dict]:
    def run(client):
        pipe = client.pipeline(transaction=False)
        for fp in fps:
            pipe.get(layout.fp_meta_key(fp))
            pipe.zcard(layout.index_key(fp))
        return pipe.execute(raise_on_error=False)

    replies = cache.transport.op(run, "ls") if fps else []
    out = {}
    for i, fp in enumerate(fps):
        raw, count = replies[2 * i], replies[2 * i + 1]
        out[fp] = {"fingerprint": fp, **_meta_fields(raw),
                   "entries": 0 if isinstance(count, Exception) else int(count)}
    return out


def _meta_fields(raw: bytes | Exception | None) -> dict:
    """library and inputs from a stored fingerprint record; one that is not a JSON object
    with a dict of inputs (written by something else, or damaged) is marked malformed."""
    if raw is None:
        return {"library": "?", "inputs": {}}
    try:
        meta = layout.load_record(_string_reply(raw))
    except BadRecord:
        meta = None
    if meta is None or not isinstance(meta.get("inputs", {}), dict):
        return {"library": "?", "inputs": {}, "malformed": True}
    return {"library": str(meta.get("library", "?")), "inputs": meta.get("inputs", {})}


def entries(cache: RedisSharedCache, fp: str) -> list[dict]:
    """Every entry indexed under fp with its manifest (None when it expired or was evicted,
    or cannot be decoded). A manifest key holding another Redis type reads as b"" (what
    quarantine expects for it): malformed, like any undecodable value."""
    members = cache.transport.op(
        lambda c: c.zrange(layout.index_key(fp), 0, -1, withscores=True), "ls")

    def run(client):
        pipe = client.pipeline(transaction=False)
        for name, _score in members:
            pipe.get(layout.manifest_key(fp, _text(name)))
        return pipe.execute(raise_on_error=False)

    raws = cache.transport.op(run, "ls") if members else []
    out = []
    for (name, score), reply in zip(members, raws, strict=True):
        raw = _string_reply(reply)
        item = {"name": _text(name), "last_used": score, "raw": raw, "manifest": None,
                "problem": None}
        if raw is not None:
            try:
                item["manifest"] = Manifest.decode(raw, ANY_SIZE)
            except BadRecord as exc:
                item["problem"] = exc
        out.append(item)
    return out


def _string_reply(reply):
    """A GET reply as bytes (None: no key); a key of another type (WRONGTYPE) as b"".
    Other errors (the store went away) raise as StoreFailed."""
    if isinstance(reply, Exception):
        if classify(reply) != "error":
            raise StoreFailed(classify(reply), str(reply))
        return layout.WRONG_TYPE
    return reply


def learned_indexes(cache: RedisSharedCache, plan_key: str | None = None) -> list[dict]:
    """Every learned index (warmd.capture), or those of one plan, under any fingerprint:
    {"fingerprint", "plan", "library", "entries": [names]}, by plan then library."""
    pattern = layout.learned_key("*", plan_key or "*").replace("{*}", "*")

    def run(client):
        found = []
        for key in client.scan_iter(match=pattern, count=500):
            name = _text(key)
            fp = name.split("{", 1)[1].split("}", 1)[0]
            found.append((fp, name.split("}:", 1)[1], client.zrange(key, 0, -1)))
        return found

    indexes = cache.transport.op(run, "ls")
    meta = fingerprint_meta(cache, sorted({fp for fp, _plan, _names in indexes}))
    out = [{"fingerprint": fp, "plan": plan, "library": meta[fp]["library"],
            "entries": sorted(_text(n) for n in names)} for fp, plan, names in indexes]
    return sorted(out, key=lambda i: (i["plan"], i["library"], i["fingerprint"]))


def entry_json(item: dict) -> dict:
    man: Manifest | None = item["manifest"]
    data = {"name": item["name"], "last_used": item["last_used"],
            "state": "ok" if man else ("missing" if item["raw"] is None else "malformed")}
    if man is not None:
        data.update({"library": man.library, "digest": man.digest, "size": man.size,
                     "producer": man.producer, "compile_seconds": man.compile_seconds,
                     "created": man.created, "signed": man.sig is not None})
    return data


def listing(cache: RedisSharedCache, selected: Iterable[str] = ()) -> list[dict]:
    """Fingerprints with entry counts and bytes (all, or the selected ones)."""
    fps = list(selected) or fingerprints(cache)
    meta = fingerprint_meta(cache, fps)
    for fp in fps:
        items = entries(cache, fp)
        meta[fp]["bytes"] = sum(i["manifest"].size for i in items if i["manifest"])
        meta[fp]["last_used"] = max((i["last_used"] for i in items), default=None)
    return [meta[fp] for fp in fps]


# --------------------------------------------------------------------------- stats

def read_stats(cache: RedisSharedCache) -> dict:
    cache.stats.flush()  # counters spooled while the store was away count now
    members = cache.transport.op(lambda c: c.smembers(layout.NODES_KEY), "stats")
    nodes = sorted(_text(n) for n in members)
    fps = fingerprints(cache)

    def run(client):
        pipe = client.pipeline(transaction=False)
        for node in nodes:
            pipe.hgetall(layout.node_stats_key(node))
        for fp in fps:
            pipe.hgetall(layout.fp_stats_key(fp))
        return pipe.execute()

    replies = cache.transport.op(run, "stats") if nodes or fps else []
    meta = fingerprint_meta(cache, fps)
    node_stats = {n: _counters(r) for n, r in zip(nodes, replies[:len(nodes)], strict=True)}
    fp_stats = {}
    for fp, raw in zip(fps, replies[len(nodes):], strict=True):
        fp_stats[fp] = {"library": meta[fp]["library"], "entries": meta[fp]["entries"],
                        "namespace": meta[fp]["inputs"].get("namespace"),
                        "counters": _counters(raw)}
    totals: dict[str, float] = {}
    for counters in node_stats.values():
        for name, value in counters.items():
            if name != "last_seen":
                totals[name] = totals.get(name, 0) + value
    return {"store": cache.display_url, "nodes": node_stats, "fingerprints": fp_stats,
            "totals": totals, "hit_rate": hit_rate(totals)}


# --------------------------------------------------------------------------- verify

@dataclass
class VerifyReport:
    checked: int = 0
    ok: int = 0
    bad: list[dict] = field(default_factory=list)
    quarantined: int = 0

    def to_json(self) -> dict:
        return {"checked": self.checked, "ok": self.ok, "bad": self.bad,
                "quarantined": self.quarantined}


def verify(cache: RedisSharedCache, selected: Iterable[str] = (),
           quarantine: bool = False) -> VerifyReport:
    """Check every entry as a fetch would (manifest, signature, chunks, digest) plus the
    archive's safety; optionally quarantine what is corrupt (never what is only unsigned)."""
    report = VerifyReport()
    for fp in list(selected) or fingerprints(cache):
        items = [i for i in entries(cache, fp) if i["raw"] is not None]
        report.checked += len(items)
        good = []
        for item in items:
            try:
                man = layout.accept_manifest(item["raw"], key=cache.session.signing_key,
                                             max_size=cache.session.max_artifact_bytes, fp=fp,
                                             name=item["name"])
                good.append((man, item["raw"]))
            except BadRecord as exc:
                _bad(cache, report, fp, item["name"], item["raw"], exc, quarantine)
        for batch in layout.size_batches(good):
            blobs = cache.entries.read_blobs([m for m, _ in batch])
            for man, raw in batch:
                blob = blobs[man.digest]
                problem = blob if isinstance(blob, BadRecord) else _unsafe(blob)
                if problem is None:
                    report.ok += 1
                else:
                    _bad(cache, report, fp, man.name, raw, problem, quarantine, man.digest)
    return report


def _unsafe(blob: bytes) -> BadRecord | None:
    limit = settings.max_artifact_bytes()
    if unpacks_over(blob, limit):
        return layout.RefusedHere(f"unpacks to more than this node's {limit}-byte limit")
    try:
        check_artifact(blob, limit)
    except UnsafeArtifact as exc:
        problem = BadRecord(f"unsafe artifact: {exc}")
        problem.counter = "unsafe_rejected"
        return problem
    return None


def _bad(cache: RedisSharedCache, report: VerifyReport, fp: str, name: str, raw: bytes,
         problem: BadRecord, quarantine: bool, digest: str | None = None) -> None:
    report.bad.append({"fingerprint": fp, "name": name, "reason": str(problem),
                       "kind": problem.counter})
    if quarantine and not isinstance(problem, (layout.SignatureRefused, layout.RefusedHere)):
        before = cache.counters.get("quarantined", 0)
        cache.entries.quarantine(fp, name, raw, str(problem), digest, counter=problem.counter)
        report.quarantined += int(cache.counters.get("quarantined", 0) - before)
    elif isinstance(problem, layout.RefusedHere):
        cache.entries.refused_here(fp, name, str(problem))
    else:
        cache.stats.count_refusal(problem.counter, fp)


# --------------------------------------------------------------------------- prune

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
    fingerprints with everything=True), index members whose manifest is gone, task records
    naming removed entries, and blob chunks no manifest references any more."""
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
                removed.append((item["name"], None))
            elif item["manifest"] is None and not isinstance(item["problem"],
                                                             layout.RefusedHere):
                report.malformed_removed += 1  # garbage for every node: never kept
                removed.append((item["name"], item["raw"]))
            elif in_scope and (doomed_fp or (cutoff is not None
                                             and item["last_used"] < cutoff)):
                report.entries_removed += 1
                man = item["manifest"]
                report.bytes_removed += man.size if man else 0
                removed.append((item["name"], item["raw"]))
        if not dry_run and removed:
            _remove_entries(cache, fp, removed)
        report.task_records_removed += _prune_tasks(cache, fp, {n for n, _ in removed},
                                                    doomed_fp, dry_run)
        if doomed_fp:
            report.fingerprints_removed += 1
            if not dry_run:
                _remove_fingerprint(cache, fp)
    report.orphan_blobs_removed = _prune_blobs(cache, dry_run)
    return report


def _remove_entries(cache: RedisSharedCache, fp: str, removed: list[tuple]) -> None:
    def run(client):
        pipe = client.pipeline(transaction=False)
        for name, _raw in removed:
            pipe.delete(layout.manifest_key(fp, name))
        pipe.zrem(layout.index_key(fp), *[name for name, _ in removed])
        return pipe.execute()

    cache.transport.op(run, "prune")


def _prune_tasks(cache: RedisSharedCache, fp: str, removed: set[str], everything: bool,
                 dry_run: bool) -> int:
    if not removed and not everything:
        return 0
    pattern = layout.task_key(fp, "*")
    keys = cache.transport.op(lambda c: list(c.scan_iter(match=pattern, count=500)), "prune")
    if not keys:
        return 0
    raws = cache.transport.op(lambda c: _get_many(c, keys, strict=False), "prune")
    doomed = []
    for key, reply in zip(keys, raws, strict=True):
        raw = _string_reply(reply)
        try:
            names = set(layout.TaskRecord.decode(raw).entries) if raw is not None else set()
        except BadRecord:
            names = removed  # malformed: remove it too
        if everything or names & removed:
            doomed.append(key)
    if doomed and not dry_run:
        cache.transport.op(lambda c: _delete_many(c, doomed), "prune")
    return len(doomed)


def _get_many(client, keys: list, strict: bool = True) -> list:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    return pipe.execute(raise_on_error=strict)


def _delete_many(client, keys: list) -> list:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.delete(key)
    return pipe.execute()


def _remove_fingerprint(cache: RedisSharedCache, fp: str) -> None:
    def run(client):
        pipe = client.pipeline(transaction=False)
        pipe.delete(layout.index_key(fp))
        pipe.delete(layout.fp_meta_key(fp))
        pipe.zrem(layout.FPS_KEY, fp)
        return pipe.execute()

    cache.transport.op(run, "prune")


_BLOB_KEY = re.compile(r"^warmd:v1:blob:\{([0-9a-f]{64})\}:\d+$")


def _prune_blobs(cache: RedisSharedCache, dry_run: bool) -> int:
    """Delete chunks of blobs that no manifest references (and that are old enough not to
    belong to a publication in flight). Returns how many blobs went."""
    referenced = {item["manifest"].digest for fp in fingerprints(cache)
                  for item in entries(cache, fp) if item["manifest"]}
    chunk_keys = cache.transport.op(lambda c: list(c.scan_iter(match=f"{layout.PREFIX}blob:*",
                                                     count=1000)), "prune")
    orphans: dict[str, list] = {}
    for key in chunk_keys:
        match = _BLOB_KEY.match(_text(key))
        if match and match.group(1) not in referenced:
            orphans.setdefault(match.group(1), []).append(key)
    if not orphans:
        return 0
    keys = [k for ks in orphans.values() for k in ks]

    def ages(client):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        return pipe.execute()

    ttls = dict(zip(keys, cache.transport.op(ages, "prune"), strict=True))
    young = cache.session.ttl_ms - ORPHAN_GRACE_MS
    old = [d for d, ks in orphans.items() if all(ttls[k] < young for k in ks)]
    if old and not dry_run:
        cache.transport.op(lambda c: _delete_many(c, [k for d in old for k in orphans[d]]), "prune")
    return len(old)


# --------------------------------------------------------------------------- export/import

_MEMBERS = {
    "meta": re.compile(r"^warmd-export\.json$"),
    "fp": re.compile(r"^fp/([0-9a-f]{8,64})\.json$"),
    "man": re.compile(r"^man/([0-9a-f]{8,64})/([A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254})\.json$"),
    "task": re.compile(r"^task/([0-9a-f]{8,64})/([0-9a-f]{64})\.json$"),
    "blob": re.compile(r"^blob/([0-9a-f]{64})$"),
}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def export_archive(cache: RedisSharedCache, path: Path, selected: Iterable[str] = ()) -> dict:
    """Write verified entries, their fingerprints and task records to a tar (atomically)."""
    fps = list(selected) or fingerprints(cache)
    meta = fingerprint_meta(cache, fps)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    counts = {"fingerprints": 0, "entries": 0, "tasks": 0, "bytes": 0, "skipped": 0}
    try:
        _write_export(cache, tmp, fps, meta, counts)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return counts


def _write_export(cache: RedisSharedCache, tmp: Path, fps: list[str], meta: dict,
                  counts: dict) -> None:
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "warmd-export.json", json.dumps(
            {"format": EXPORT_FORMAT, "version": 1, "created": time.time(),
             "store": cache.display_url}).encode())
        for fp in fps:
            if meta[fp].get("malformed"):  # an import could not check its entries anyway
                counts["skipped"] += meta[fp]["entries"]
                continue
            counts["fingerprints"] += 1
            _add(tar, f"fp/{fp}.json", json.dumps(
                {"library": meta[fp]["library"], "digest": fp,
                 "inputs": meta[fp]["inputs"]}).encode())
            exported = _export_entries(cache, tar, fp, counts)
            _export_tasks(cache, tar, fp, exported, counts)


def _export_entries(cache: RedisSharedCache, tar: tarfile.TarFile, fp: str,
                    counts: dict) -> set[str]:
    good = []
    for item in entries(cache, fp):
        try:
            man = layout.accept_manifest(item["raw"], key=cache.session.signing_key,
                                         max_size=cache.session.max_artifact_bytes, fp=fp,
                                         name=item["name"]) if item["raw"] else None
        except BadRecord:
            man = None
        if man is None:
            counts["skipped"] += 1
            continue
        good.append((man, item["raw"]))
    exported, blobs_done = set(), set()
    for batch in layout.size_batches(good):
        blobs = cache.entries.read_blobs([m for m, _ in batch])
        for man, raw in batch:
            blob = blobs[man.digest]
            if isinstance(blob, BadRecord):
                counts["skipped"] += 1
                continue
            if man.digest not in blobs_done:
                _add(tar, f"blob/{man.digest}", blob)
                blobs_done.add(man.digest)
                counts["bytes"] += len(blob)
            _add(tar, f"man/{fp}/{man.name}.json", raw)
            exported.add(man.name)
            counts["entries"] += 1
    return exported


def _export_tasks(cache: RedisSharedCache, tar: tarfile.TarFile, fp: str, exported: set[str],
                  counts: dict) -> None:
    keys = cache.transport.op(
        lambda c: list(c.scan_iter(match=layout.task_key(fp, "*"), count=500)), "export")
    raws = cache.transport.op(lambda c: _get_many(c, keys, strict=False), "export") if keys else []
    for raw in raws:
        if raw is None or isinstance(raw, Exception):  # gone, or not a string (WRONGTYPE)
            continue
        try:
            rec = layout.TaskRecord.decode(raw)
        except BadRecord:
            continue
        if set(rec.entries) <= exported:
            _add(tar, f"task/{fp}/{layout.sha256(rec.task.encode())}.json", raw)
            counts["tasks"] += 1


def _scan_archive(tar: tarfile.TarFile, max_blob: int) -> dict[str, list]:
    """Check every member's name, type and size before anything is read or written."""
    found: dict[str, list] = {kind: [] for kind in _MEMBERS}
    for member in tar.getmembers():
        kind = next((k for k, rx in _MEMBERS.items() if rx.match(member.name)), None)
        if kind is None or ".." in member.name:
            raise UnsafeArchive(f"unexpected member {member.name!r} (an export holds only "
                                "warmd-export.json, fp/, man/, task/ and blob/ files)")
        if not member.isreg():
            raise UnsafeArchive(f"member {member.name!r} is not a regular file")
        limit = max_blob if kind == "blob" else layout.MAX_RECORD_BYTES
        if member.size > limit:
            raise UnsafeArchive(f"member {member.name!r} is {member.size} bytes, over the "
                                f"{limit}-byte limit")
        found[kind].append(member)
    if len(found["meta"]) != 1:
        raise UnsafeArchive("not a warmd cache export (no warmd-export.json)")
    return found


def import_archive(cache: RedisSharedCache, path: Path) -> dict:
    """Import an export, verifying everything as fetch does (manifest, signature, digest,
    archive safety); refused items are counted and skipped. Raises UnsafeArchive (nothing
    written) when the archive itself is malformed or unsafe."""
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise UnsafeArchive(f"cannot read {path} as a tar archive: {exc}") from None
    with tar:
        found = _scan_archive(tar, cache.session.max_artifact_bytes)
        header = _json_member(tar, found["meta"][0])
        if header.get("format") != EXPORT_FORMAT or header.get("version") != 1:
            raise UnsafeArchive("not a warmd cache export (format/version)")
        blobs = {_MEMBERS["blob"].match(m.name).group(1): m for m in found["blob"]}
        fps = {_MEMBERS["fp"].match(m.name).group(1): _json_member(tar, m)
               for m in found["fp"]}
        counts = {"imported": 0, "already_present": 0, "tasks": 0, "tasks_skipped": 0,
                  **dict.fromkeys(ids(F.REFUSAL), 0)}
        accepted: dict[str, set[str]] = {}
        for member in found["man"]:
            fp, name = _MEMBERS["man"].match(member.name).groups()
            if _import_entry(cache, tar, fp, name, member, fps.get(fp), blobs, counts):
                accepted.setdefault(fp, set()).add(name)
        for member in found["task"]:
            fp = _MEMBERS["task"].match(member.name).group(1)
            _import_task(cache, tar, fp, member, accepted.get(fp, set()), counts)
    cache.stats.flush()
    return counts


def _json_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    try:
        return layout.load_record(tar.extractfile(member).read())
    except BadRecord as exc:
        raise UnsafeArchive(f"member {member.name!r}: {exc}") from None


def _refuse(cache: RedisSharedCache, counts: dict, fp: str, what: str,
            problem: BadRecord) -> None:
    counts[problem.counter] += 1
    if isinstance(problem, layout.RefusedHere):
        cache.entries.refused_here(fp, what, str(problem))
    else:
        cache.entries.reject(problem.counter, fp, what, str(problem))


def _import_entry(cache: RedisSharedCache, tar: tarfile.TarFile, fp: str, name: str,
                  member: tarfile.TarInfo, fp_meta: dict | None, blobs: dict,
                  counts: dict) -> bool:
    raw = tar.extractfile(member).read()
    try:
        man = layout.accept_manifest(raw, key=cache.session.signing_key,
                                     max_size=cache.session.max_artifact_bytes, fp=fp, name=name)
        if (fp_meta is None or fp_meta.get("digest") != fp
                or not isinstance(fp_meta.get("inputs"), dict)
                or digest_of(fp_meta["inputs"]) != fp):
            raise BadRecord("entry without its fingerprint, or a fingerprint that does not "
                            "match its inputs")
        if man.digest not in blobs:
            raise BadRecord("entry without its blob in the archive")
        blob = layout.verify_blob(man, tar.extractfile(blobs[man.digest]).read())
        problem = _unsafe(blob)
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


def _import_task(cache: RedisSharedCache, tar: tarfile.TarFile, fp: str,
                 member: tarfile.TarInfo, accepted: set[str], counts: dict) -> None:
    raw = tar.extractfile(member).read()
    try:
        rec = layout.TaskRecord.decode(raw)
        rec = layout.accept_record(raw, key=cache.session.signing_key, fp=fp, task=rec.task)
    except BadRecord as exc:
        _refuse(cache, counts, fp, "imported task record", exc)
        return
    if not set(rec.entries) <= accepted:  # it would only ever miss
        counts["tasks_skipped"] += 1
        return

    def run(client):
        return client.set(layout.task_key(fp, rec.task), raw, nx=True, px=cache.session.ttl_ms)

    if cache.transport.op(run, "import"):
        counts["tasks"] += 1
