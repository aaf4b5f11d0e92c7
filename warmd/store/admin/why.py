"""`warmd cache why`: why this node misses an entry or a task. The store keeps each
fingerprint's inputs beside it (warmd:v1:fp:{fp}); a miss here means the entry sits under
another fingerprint, or under none. For each fingerprint that holds it, the inputs that
differ from this node's, each with why the library's key depends on it and what to change
(the adapter's ``input_reasons``, the common ``COMMON_INPUTS``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.store import layout
from warmd.store.admin.reads import fingerprint_meta, fingerprints
from warmd.store.fingerprint import COMMON_INPUTS, Fingerprint
from warmd.store.shared import StoreSharedCache


@dataclass(frozen=True)
class Difference:
    input: str
    here: object
    there: object
    why: str
    change: str

    def to_json(self) -> dict:
        return {"input": self.input, "here": self.here, "there": self.there, "why": self.why,
                "change": self.change}


@dataclass
class Why:
    """Where an entry or task is published, and what keeps it from this node."""

    name: str
    library: str
    here: str  # this node's fingerprint digest
    hit: bool = False  # published under this node's fingerprint
    elsewhere: dict[str, list[Difference]] = field(default_factory=dict)  # fp -> differences

    def to_json(self) -> dict:
        return {"name": self.name, "library": self.library, "fingerprint": self.here,
                "hit": self.hit,
                "elsewhere": {fp: [d.to_json() for d in diffs]
                              for fp, diffs in self.elsewhere.items()}}


def differences(here: dict, there: dict,
                reasons: dict[str, tuple[str, str]]) -> list[Difference]:
    """The inputs whose values differ (absent on one side counts), each with its reason."""
    known = {**COMMON_INPUTS, **reasons}
    out = []
    for key in sorted(set(here) | set(there)):
        if here.get(key) != there.get(key):
            why, change = known.get(key, ("an input of this library's key", "make it equal"))
            out.append(Difference(key, here.get(key), there.get(key), why, change))
    return out


def why(cache: StoreSharedCache, mine: Fingerprint, name: str,
        reasons: dict[str, tuple[str, str]]) -> Why:
    """Where `name` (a task key or an entry name) is published, compared with this node's
    fingerprint `mine`."""
    found = Why(name, mine.library, mine.digest)
    meta = fingerprint_meta(cache, fingerprints(cache))
    for fp, info in meta.items():
        if info.get("library") != mine.library or not _holds(cache, fp, name):
            continue
        if fp == mine.digest:
            found.hit = True
        else:
            found.elsewhere[fp] = differences(mine.inputs, info.get("inputs") or {}, reasons)
    return found


def _holds(cache: StoreSharedCache, fp: str, name: str) -> bool:
    """Whether fp has a task record of that key or an indexed entry of that name."""
    found = cache.backend.get_many([layout.task_key(fp, name), layout.used_key(fp, name)])
    return any(value is not None for value in found)
