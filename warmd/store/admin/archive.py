"""The export archive's format: a tar holding warmd-export.json, fp/<fp>.json,
man/<fp>/<entry>.json, task/<fp>/<sha256 of the task key>.json and blob/<digest>; every
member's name, type and size checked before anything is read."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time

from warmd.store import layout
from warmd.store.validation import MAX_RECORD_BYTES, BadRecord, load_record

EXPORT_FORMAT = "warmd-cache-export"
HEADER = "warmd-export.json"
# kind -> (what a member of that kind is named, the pattern its name must match)
_MEMBERS = {
    "meta": (HEADER, re.compile(r"^warmd-export\.json$")),
    "fp": ("fp/{}.json", re.compile(r"^fp/([0-9a-f]{8,64})\.json$")),
    "man": ("man/{}/{}.json",
            re.compile(r"^man/([0-9a-f]{8,64})/([A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254})\.json$")),
    "task": ("task/{}/{}.json", re.compile(r"^task/([0-9a-f]{8,64})/([0-9a-f]{64})\.json$")),
    "blob": ("blob/{}", re.compile(r"^blob/([0-9a-f]{64})$")),
}


class UnsafeArchive(ValueError):
    """An export archive that must not be imported (traversal, links, unknown members)."""


def header(store: str) -> bytes:
    return json.dumps({"format": EXPORT_FORMAT, "version": 1, "created": time.time(),
                       "store": store}).encode()


def check_header(data: dict) -> None:
    if data.get("format") != EXPORT_FORMAT or data.get("version") != 1:
        raise UnsafeArchive("not a warmd cache export (format/version)")


def member_name(kind: str, *parts: str) -> str:
    """The name of a member: ("fp", fp), ("man", fp, entry name), ("task", fp, task key:
    stored under its SHA-256), ("blob", digest)."""
    if kind == "task":
        parts = (parts[0], layout.sha256(parts[1].encode()))
    return _MEMBERS[kind][0].format(*parts)


def member_fields(kind: str, member: tarfile.TarInfo) -> tuple[str, ...]:
    """What a member's name holds: (fp,) for "fp" and "task", (fp, entry name) for "man",
    (digest,) for "blob"; checked by scan() already."""
    groups = _MEMBERS[kind][1].match(member.name).groups()
    return groups[:1] if kind == "task" else groups


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def scan(tar: tarfile.TarFile, max_blob: int) -> dict[str, list[tarfile.TarInfo]]:
    """The members by kind ("meta", "fp", "man", "task", "blob"), each checked for its
    name, type and size before anything is read or written; raises UnsafeArchive."""
    found: dict[str, list] = {kind: [] for kind in _MEMBERS}
    for member in tar.getmembers():
        kind = next((k for k, (_name, rx) in _MEMBERS.items() if rx.match(member.name)),
                    None)
        if kind is None or ".." in member.name:
            raise UnsafeArchive(f"unexpected member {member.name!r} (an export holds only "
                                "warmd-export.json, fp/, man/, task/ and blob/ files)")
        if not member.isreg():
            raise UnsafeArchive(f"member {member.name!r} is not a regular file")
        limit = max_blob if kind == "blob" else MAX_RECORD_BYTES
        if member.size > limit:
            raise UnsafeArchive(f"member {member.name!r} is {member.size} bytes, over the "
                                f"{limit}-byte limit")
        found[kind].append(member)
    if len(found["meta"]) != 1:
        raise UnsafeArchive("not a warmd cache export (no warmd-export.json)")
    return found


def json_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    try:
        return load_record(tar.extractfile(member).read())
    except BadRecord as exc:
        raise UnsafeArchive(f"member {member.name!r}: {exc}") from None
