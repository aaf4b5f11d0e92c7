"""The vocabulary of cluster work, below everything that claims it: what a claim on a unit
of work found, and the kernel lists discoveries publish. The store answers in these types,
and the executors' kernel stages and the warmup's claim loops read them; none of them
knows the others."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ClaimState(str, enum.Enum):
    """What a claim on one unit of cluster work (an entry, or a task) found."""

    MINE = "mine"  # this process holds it now: compile it, publish it, release it
    PUBLISHED = "published"  # another node published it: install it
    HELD = "held"  # another node is compiling it: come back to it later
    # nobody holds it and this node may not claim it (a read-only store user): build it
    # here, publish nothing (per-task leases only; work claims never answer it)
    FREE = "free"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    holder: str = ""  # who holds it (HELD)


@dataclass(frozen=True)
class KernelList:
    """What the store holds of the kernel lists discoveries published: per task (by its
    digest) the entries it needs, and each of those entries' job record (each verified)."""

    tasks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task digest -> entries
    jobs: dict[str, dict] = field(default_factory=dict)  # entry -> its job record
    refused: str | None = None  # a record failed verification: none of it is used


class WorkKind(str, enum.Enum):
    """What a unit of cluster work is; one claim protocol serves every kind."""

    ENTRY = "entry"  # one cache entry (a kernel), published when built
    TASK = "task"  # a task whose entries are not known before it runs, with its record
    DISCOVERY = "discovery"  # finding the kernels of a slice of tasks, published as a list

    def __str__(self) -> str:
        return self.value


def discovery_unit(digest: str) -> str:
    """The lease name a discovery slice (by its task digest) is claimed under."""
    return f"discovery.{digest}"
