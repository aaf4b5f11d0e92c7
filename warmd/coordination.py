"""The vocabulary of cluster work, below everything that claims it: what a claim on a unit
of work found, the kernel lists discoveries publish, and what one node did of the work
(BootReport). The store answers in these types, and the executors' kernel stages and the
warmup's claim loops read them; none of them knows the others."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields


class ClaimState(enum.StrEnum):
    """What a claim on one unit of cluster work (an entry, or a task) found."""

    MINE = "mine"  # this process holds it now: compile it, publish it, release it
    PUBLISHED = "published"  # another node published it: install it
    HELD = "held"  # another node is compiling it: come back to it later
    # nobody holds it and this node may not claim it (a read-only store user): build it
    # here, publish nothing (per-task leases only; work claims never answer it)
    FREE = "free"


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    holder: str = ""  # who holds it (HELD)


@dataclass(frozen=True)
class KernelList:
    """What the store holds of the kernel lists discoveries published: per task (by its
    digest) the entries it needs, and each of those entries' job record (each verified)."""

    tasks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task digest -> entries
    # task digest -> the other entries its discovery process had named before it: a kernel
    # is named once per process, so a task reusing one of them needs it too (maybe)
    also: dict[str, tuple[str, ...]] = field(default_factory=dict)
    jobs: dict[str, dict] = field(default_factory=dict)  # entry -> its job record
    refused: str | None = None  # a record failed verification: none of it is used


class WorkKind(enum.StrEnum):
    """What a unit of cluster work is; one claim protocol serves every kind."""

    ENTRY = "entry"  # one cache entry (a kernel), published when built
    TASK = "task"  # a task whose entries are not known before it runs, with its record
    DISCOVERY = "discovery"  # finding the kernels of a slice of tasks, published as a list


def discovery_unit(digest: str) -> str:
    """The lease name a discovery slice (by its task digest) is claimed under."""
    return f"discovery.{digest}"


@dataclass
class BootReport:
    """What one node did of the cluster's work in a run: kernels compiled here, installed
    from peers, found held by another node (waited for), taken over from a dead claimer;
    and when (seconds from the run's start; None: not reached). Its JSON is its fields
    (wait_seconds to the millisecond): what `--json` prints and node records keep."""

    compiled: int = 0
    installed: int = 0
    waited: int = 0
    took_over: int = 0
    failed: int = 0
    wait_seconds: float = 0.0  # summed over the units waited for
    timeline: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def counts(cls) -> tuple[str, ...]:
        """The names of its counts, in order."""
        return tuple(f.name for f in fields(cls) if f.type == "int")

    def add(self, other: BootReport) -> None:
        """Another model's work on this node, as its JSON says it: counts and wait seconds
        added, each timeline moment the later of the two (a node is done when its last
        model is); moments not reached are left out."""
        part = other.to_json()
        for name in self.counts():
            setattr(self, name, getattr(self, name) + part[name])
        self.wait_seconds = round(self.wait_seconds + part["wait_seconds"], 3)
        timeline = dict(self.timeline)
        for moment, at in part["timeline"].items():
            if at is not None:
                timeline[moment] = max(at, timeline.get(moment) or at)
        self.timeline = timeline

    def add_stage(self, stage: BootReport, library: str) -> None:
        """A kernel stage's share of the cluster's work; its moments named library.moment."""
        for name in self.counts():
            setattr(self, name, getattr(self, name) + getattr(stage, name))
        self.wait_seconds += stage.wait_seconds
        self.timeline = {**self.timeline,
                         **{f"{library}.{k}": v for k, v in stage.timeline.items()}}

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["wait_seconds"] = round(self.wait_seconds, 3)
        return data

    @classmethod
    def from_json(cls, data: dict) -> BootReport:
        """Read back from its JSON (a node record, a worker's answer over Ray, a kernel
        stage's report); keys it does not know are left out, missing ones are zero."""
        boot = cls(timeline=dict(data.get("timeline") or {}))
        for name in cls.counts():
            setattr(boot, name, int(data.get(name) or 0))
        boot.wait_seconds = float(data.get("wait_seconds") or 0.0)
        return boot


@dataclass
class DiscoveryReport:
    """What one node did of a kernel stage's discovery slices: how many the plan has,
    discovered here, read from other nodes' lists, failed here, taken over from a node
    that died; the longest wait on a slice another node held; its claim loop's timeline."""

    slices: int = 0
    discovered_here: int = 0
    read: int = 0
    failed: int = 0
    taken_over: int = 0
    waited_seconds: float = 0.0
    timeline: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
