"""The one table of counters (in the manner of ccache's statistics table), and what is
derived from it: `Counters` (a warmup run's counters and the cluster totals), its text and
JSON renderings, the store's per-node and per-fingerprint stats, `warmd cache stats`'
columns, `warmd status`' kernel counts and the Prometheus outcome labels.

A counter name is written once, here; everything else selects counters by flag.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields, make_dataclass


class Outcome(str, enum.Enum):
    """How a kernel (cache entry) a task touched was obtained; the value is its JSON."""

    LOCAL_HIT = "local_hit"  # already in this node's cache
    REMOTE_HIT = "remote_hit"  # installed from the shared cache in this run
    COMPILED = "compiled"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    @property
    def is_hit(self) -> bool:
        return self in (Outcome.LOCAL_HIT, Outcome.REMOTE_HIT)


class F(enum.Flag):
    NONE = 0
    RUN = enum.auto()  # a warmup counts it: a field of Counters
    STORE = enum.auto()  # only the store can count it; warmup's reports of it are ignored
    KERNEL = enum.auto()  # a kernel outcome: kernels = sum of these
    HIT = enum.auto()  # an outcome that is a hit (hit rate = hits / kernels)
    ERROR = enum.auto()  # something failed or was refused
    REFUSAL = enum.auto()  # a shared entry refused (counted per kind by verify and import)
    TROUBLE = enum.auto()  # the shared cache did not do its job: the node is DEGRADED
    DOWN = enum.auto()  # ...because it was unreachable (else it refused work)
    TIME = enum.auto()  # seconds (float)
    BYTES = enum.auto()
    DETAIL = enum.auto()  # shown indented under the row before
    SHOWN = enum.auto()  # a store counter `warmd cache stats` lists under the summary
    NODE_COLUMN = enum.auto()  # a column of `warmd cache stats`' per-node table
    FP_COLUMN = enum.auto()  # a column of its per-fingerprint table
    CAPTURE = enum.auto()  # a node agent's capture counts it, per library (warmd.capture)


@dataclass(frozen=True)
class Stat:
    id: str
    description: str  # as the text renderings show it
    flags: F = F.NONE
    outcome: Outcome | None = None  # the kernel outcome it counts (KERNEL), a Prometheus label
    column: str | None = None  # header in `warmd cache stats` tables

    def has(self, flag: F) -> bool:
        return bool(self.flags & flag)


_COLS = F.NODE_COLUMN | F.FP_COLUMN
COUNTERS: tuple[Stat, ...] = (
    # What a warmup counts (Counters fields, in the order the text shows them).
    Stat("tasks", "Tasks", F.RUN),
    Stat("tasks_failed", "failed", F.RUN | F.ERROR | F.DETAIL),
    Stat("local_hits", "local hits", F.RUN | F.KERNEL | F.HIT | F.DETAIL | _COLS, Outcome.LOCAL_HIT,
         "local"),
    Stat("remote_hits", "remote hits", F.RUN | F.KERNEL | F.HIT | F.DETAIL | _COLS,
         Outcome.REMOTE_HIT, "remote"),
    Stat("compiled", "compiled", F.RUN | F.KERNEL | F.DETAIL | F.NODE_COLUMN, Outcome.COMPILED,
         "compiled"),
    Stat("failed", "failed", F.RUN | F.KERNEL | F.ERROR | F.DETAIL | F.NODE_COLUMN, Outcome.FAILED,
         "failed"),
    Stat("compile_seconds", "Compile time", F.RUN | F.TIME),
    Stat("compile_seconds_saved", "Compile time saved", F.RUN | F.TIME | _COLS,
         column="saved"),
    # Where a warm path spends its time: reading entries from the store (records, manifests,
    # blobs, their digests checked), writing them into the local cache, and checking entries
    # already on disk against this node's task records.
    Stat("fetch_seconds", "Fetch time", F.RUN | F.STORE | F.TIME),
    Stat("install_seconds", "Install time", F.RUN | F.STORE | F.TIME),
    Stat("verify_seconds", "Verify time", F.RUN | F.TIME),
    Stat("corrupt_rejected", "Corrupt entries rejected",
         F.RUN | F.STORE | F.ERROR | F.REFUSAL | _COLS, column="rejected"),
    Stat("bytes_fetched", "Fetched", F.RUN | F.STORE | F.BYTES | _COLS, column="fetched"),
    Stat("bytes_published", "Published", F.RUN | F.STORE | F.BYTES | F.NODE_COLUMN,
         column="published"),
    # What only the store counts (its per-node and per-fingerprint stats).
    Stat("signature_rejected", "bad or missing signature",
         F.STORE | F.ERROR | F.REFUSAL | F.DETAIL | F.SHOWN),
    Stat("unsafe_rejected", "unsafe archive",
         F.STORE | F.ERROR | F.REFUSAL | F.DETAIL | F.SHOWN),
    Stat("refused_here", "Entries this node cannot use", F.STORE | F.REFUSAL),
    Stat("quarantined", "Entries quarantined", F.STORE | F.SHOWN),
    Stat("published", "Entries published", F.STORE | F.SHOWN | F.FP_COLUMN, column="published"),
    Stat("already_published", "Entries another node had published", F.STORE),
    Stat("imported", "Entries imported", F.STORE),
    Stat("publish_denied", "Publish refused (ACL)", F.STORE | F.ERROR | F.TROUBLE | F.SHOWN),
    Stat("publish_failed", "Publish failed", F.STORE | F.ERROR | F.TROUBLE | F.SHOWN),
    Stat("publish_skipped", "Publish skipped (store off or read-only)", F.STORE),
    Stat("store_errors", "Store errors", F.STORE | F.ERROR | F.TROUBLE | F.DOWN | F.SHOWN),
    Stat("store_skipped", "Skipped (breaker open)", F.STORE | F.TROUBLE | F.DOWN | F.SHOWN),
    Stat("install_failed", "Installs failed here", F.STORE | F.ERROR),
    Stat("fetch_failed", "Fetches failed (bug)", F.STORE | F.ERROR | F.SHOWN),
    Stat("tasks_hit", "Tasks found complete", F.STORE),
    Stat("tasks_missed", "Tasks not found", F.STORE),
    Stat("leases_acquired", "Leases acquired", F.STORE),
    Stat("lease_waits", "Waited for another node", F.STORE | F.SHOWN),
    Stat("lease_waits_satisfied", "Waits ended by a publication", F.STORE),
    Stat("published_meanwhile", "Published before the lease was asked", F.STORE),
    Stat("lease_takeovers", "Leases taken over", F.STORE | F.SHOWN),
    Stat("lease_timeouts", "Waits timed out", F.STORE | F.ERROR | F.SHOWN),
    Stat("lease_lost", "Leases lost while compiling", F.STORE | F.ERROR),
    # Hardening (issue 13): what happened to entries this node refused.
    Stat("replaced", "Refused entries replaced", F.STORE | F.SHOWN),
    Stat("publish_blocked", "Replace refused (no key)",
         F.STORE | F.ERROR | F.SHOWN),
    # What a node's capture counts after READY (node records, Prometheus `warmd_<id>_total`).
    Stat("runtime_jit", "Runtime JIT (after READY)", F.CAPTURE | F.ERROR),
    Stat("captured", "Entries captured and shared", F.CAPTURE),
    Stat("capture_refused", "Captured entries refused (unsafe)", F.CAPTURE | F.ERROR),
)
# HELP of the Prometheus counters derived from the table (warmd.cluster.metrics): every
# counter a warmup or a capture counts that is not a kernel outcome (those are one
# `warmd_kernels_total` by outcome).
HELP: dict[str, str] = {
    "tasks": "Warmup tasks run (a task is one JIT module, or one GEMM shape's kernels)",
    "tasks_failed": "Warmup tasks that failed",
    "compile_seconds": "Time spent compiling kernels",
    "compile_seconds_saved": "Compile time saved: what the kernels found in a cache took "
                             "to compile where they were built",
    "fetch_seconds": "Time spent reading entries from the shared cache and checking digests",
    "install_seconds": "Time spent writing fetched entries into the local kernel caches",
    "verify_seconds": "Time spent checking kernels already on disk against their records",
    "corrupt_rejected": "Shared-cache entries refused as malformed, mismatched or corrupt",
    "bytes_fetched": "Bytes fetched from the shared cache",
    "bytes_published": "Bytes published to the shared cache",
    "runtime_jit": "Kernels the engine compiled after the node was READY (missed by warmup)",
    "captured": "Kernels compiled after READY that were captured and shared (or found shared)",
    "capture_refused": "Kernels compiled after READY refused for sharing (unsafe or too large)",
}
BY_ID = {s.id: s for s in COUNTERS}
BY_OUTCOME = {s.outcome: s for s in COUNTERS if s.outcome}


def help_text(stat: Stat) -> str:
    """The HELP of the counter's Prometheus metric."""
    return HELP[stat.id]


def select(flag: F, without: F = F.NONE) -> tuple[Stat, ...]:
    """The counters with every flag in `flag` and none in `without`, in table order."""
    return tuple(s for s in COUNTERS if s.flags & flag == flag and not s.flags & without)


def ids(flag: F, without: F = F.NONE) -> tuple[str, ...]:
    return tuple(s.id for s in select(flag, without))


def hit_rate(values: dict) -> float | None:
    """Hits over kernels of any counter mapping; None when there were no kernels."""
    total = sum(values.get(i, 0) for i in ids(F.KERNEL))
    return sum(values.get(i, 0) for i in ids(F.KERNEL | F.HIT)) / total if total else None


class _CountersBase:
    """Methods of Counters (its fields come from the table)."""

    def add(self, other: Counters | dict) -> Counters:
        """Add another counter set (or a dict of some counters, e.g. from the store)."""
        values = other.to_json() if isinstance(other, _CountersBase) else other
        for f in fields(self):
            if f.name in values and values[f.name] is not None:
                cast = float if BY_ID[f.name].has(F.TIME) else int
                setattr(self, f.name, getattr(self, f.name) + cast(values[f.name]))
        return self

    @property
    def kernels(self) -> int:
        return sum(getattr(self, i) for i in ids(F.KERNEL))

    @property
    def hit_rate(self) -> float:
        """Hits over all kernels looked at; 0.0 when there were none."""
        return hit_rate(self.to_json()) or 0.0

    def kernel_counts(self) -> dict[str, int]:
        """{"total": kernels, and each outcome}: what a node record and `warmd status` show."""
        return {"total": self.kernels, **{i: getattr(self, i) for i in ids(F.KERNEL)}}

    def to_json(self) -> dict:
        data = asdict(self)
        for name in ids(F.RUN | F.TIME):
            data[name] = round(data[name], 3)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Counters:
        return cls().add(data)

    def render_text(self, title: str = "warmd cache statistics") -> str:
        total = self.kernels
        rows = []
        for stat in select(F.RUN):
            if stat.id == ids(F.KERNEL)[0]:
                rows.append(("Kernels", f"{total}", ""))
            value = getattr(self, stat.id)
            share = f"({100.0 * value / total:5.1f}%)" if stat.has(F.KERNEL) and total else ""
            rows.append((_label(stat), format_value(stat, value), share))
            if stat.id == ids(F.KERNEL)[-1]:
                rows.append(("Hit rate", f"{100.0 * self.hit_rate:.1f} %", ""))
        width = max(len(r[0]) for r in rows) + 2
        lines = [title]
        lines += [f"{label:<{width}}{value:>12} {extra}".rstrip() for label, value, extra in rows]
        return "\n".join(lines)


Counters = make_dataclass(
    "Counters",
    [(s.id, float if s.has(F.TIME) else int, field(default=0.0 if s.has(F.TIME) else 0))
     for s in select(F.RUN)],
    bases=(_CountersBase,))
Counters.__module__ = __name__
Counters.__doc__ = "One set of cache counters, for a warmup run and the cluster totals alike."


def render_details(totals: dict) -> list[str]:
    """The store counters `warmd cache stats` lists under the Counters summary."""
    return [f"{_label(s):<26}{int(totals.get(s.id, 0)):>12}" for s in select(F.SHOWN)]


def _label(stat: Stat) -> str:
    return f"  {stat.description}" if stat.has(F.DETAIL) else stat.description


def format_value(stat: Stat, value: float) -> str:
    if stat.has(F.TIME):
        return format_seconds(float(value))
    if stat.has(F.BYTES):
        return format_bytes(int(value))
    return f"{int(value)}"


def format_seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def format_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"
