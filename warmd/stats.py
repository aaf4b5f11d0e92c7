"""The one table of counters (in the manner of ccache's statistics table), and what is
derived from it: `Counters` (a warmup run's counters and the cluster totals), its text and
JSON renderings, the store's per-node and per-fingerprint stats, `warmd cache stats`'
columns, `warmd status`' kernel counts and the Prometheus outcome labels.

A counter name is written once, here; everything else selects counters by flag.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields, make_dataclass


class Outcome(enum.StrEnum):
    """How a kernel (cache entry) a task touched was obtained; the value is its JSON."""

    LOCAL_HIT = "local_hit"  # already in this node's cache
    REMOTE_HIT = "remote_hit"  # installed from the shared cache in this run
    COMPILED = "compiled"
    FAILED = "failed"


    @property
    def is_hit(self) -> bool:
        return self in (Outcome.LOCAL_HIT, Outcome.REMOTE_HIT)


class CounterFlag(enum.Flag):
    """What a counter is and where it shows (a counter has several)."""

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
    flags: CounterFlag = CounterFlag.NONE
    outcome: Outcome | None = None  # the kernel outcome it counts (KERNEL), a Prometheus label
    column: str | None = None  # header in `warmd cache stats` tables

    def has(self, flag: CounterFlag) -> bool:
        return bool(self.flags & flag)


# The table spells CounterFlag as _F, so that each counter reads on one line.
_F = CounterFlag
_COLS = _F.NODE_COLUMN | _F.FP_COLUMN
COUNTERS: tuple[Stat, ...] = (
    # What a warmup counts (Counters fields, in the order the text shows them).
    Stat("tasks", "Tasks", _F.RUN),
    Stat("tasks_failed", "failed", _F.RUN | _F.ERROR | _F.DETAIL),
    Stat("local_hits", "local hits", _F.RUN | _F.KERNEL | _F.HIT | _F.DETAIL | _COLS,
         Outcome.LOCAL_HIT, "local"),
    Stat("remote_hits", "remote hits", _F.RUN | _F.KERNEL | _F.HIT | _F.DETAIL | _COLS,
         Outcome.REMOTE_HIT, "remote"),
    Stat("compiled", "compiled", _F.RUN | _F.KERNEL | _F.DETAIL | _F.NODE_COLUMN,
         Outcome.COMPILED, "compiled"),
    Stat("failed", "failed", _F.RUN | _F.KERNEL | _F.ERROR | _F.DETAIL | _F.NODE_COLUMN,
         Outcome.FAILED, "failed"),
    Stat("compile_seconds", "Compile time", _F.RUN | _F.TIME),
    Stat("compile_seconds_saved", "Compile time saved", _F.RUN | _F.TIME | _COLS,
         column="saved"),
    # Where a warm path spends its time: reading entries from the store (records, manifests,
    # blobs, their digests checked), writing them into the local cache, and checking entries
    # already on disk against this node's task records.
    Stat("fetch_seconds", "Fetch time", _F.RUN | _F.STORE | _F.TIME),
    Stat("install_seconds", "Install time", _F.RUN | _F.STORE | _F.TIME),
    Stat("verify_seconds", "Verify time", _F.RUN | _F.TIME),
    Stat("corrupt_rejected", "Corrupt entries rejected",
         _F.RUN | _F.STORE | _F.ERROR | _F.REFUSAL | _COLS, column="rejected"),
    Stat("bytes_fetched", "Fetched", _F.RUN | _F.STORE | _F.BYTES | _COLS, column="fetched"),
    Stat("bytes_published", "Published", _F.RUN | _F.STORE | _F.BYTES | _F.NODE_COLUMN,
         column="published"),
    # What only the store counts (its per-node and per-fingerprint stats).
    Stat("signature_rejected", "bad/missing signature",
         _F.STORE | _F.ERROR | _F.REFUSAL | _F.DETAIL | _F.SHOWN),
    Stat("unsafe_rejected", "unsafe archive",
         _F.STORE | _F.ERROR | _F.REFUSAL | _F.DETAIL | _F.SHOWN),
    Stat("refused_here", "Entries this node cannot use", _F.STORE | _F.REFUSAL),
    Stat("quarantined", "Entries quarantined", _F.STORE | _F.SHOWN),
    # "published" alone, as a column or a label, is bytes (bytes_published) everywhere
    Stat("published", "Entries published", _F.STORE | _F.SHOWN | _F.FP_COLUMN,
         column="publications"),
    Stat("already_published", "Entries another node had published", _F.STORE),
    Stat("imported", "Entries imported", _F.STORE),
    Stat("publish_denied", "Publish refused (ACL)", _F.STORE | _F.ERROR | _F.TROUBLE | _F.SHOWN),
    Stat("publish_failed", "Publish failed", _F.STORE | _F.ERROR | _F.TROUBLE | _F.SHOWN),
    Stat("publish_skipped", "Publish skipped (store off or read-only)", _F.STORE),
    Stat("store_errors", "Store errors", _F.STORE | _F.ERROR | _F.TROUBLE | _F.DOWN | _F.SHOWN),
    Stat("store_skipped", "Skipped (breaker open)", _F.STORE | _F.TROUBLE | _F.DOWN | _F.SHOWN),
    Stat("store_retries", "Store calls retried", _F.STORE | _F.SHOWN),
    Stat("store_unreachable", "Store down past budget",
         _F.STORE | _F.ERROR | _F.TROUBLE | _F.DOWN | _F.SHOWN),
    Stat("peer_hits", "Entries from other nodes", _F.STORE | _F.SHOWN),
    Stat("bytes_from_peers", "Fetched from other nodes", _F.STORE | _F.BYTES),
    Stat("peer_refused", "Peer bytes bad digest", _F.STORE | _F.ERROR | _F.SHOWN),
    Stat("install_failed", "Installs failed here", _F.STORE | _F.ERROR),
    Stat("fetch_failed", "Fetches failed (bug)", _F.STORE | _F.ERROR | _F.SHOWN),
    Stat("tasks_hit", "Tasks found complete", _F.STORE),
    Stat("tasks_missed", "Tasks not found", _F.STORE),
    Stat("leases_acquired", "Leases acquired", _F.STORE),
    Stat("lease_waits", "Waited for another node", _F.STORE | _F.SHOWN),
    Stat("lease_waits_satisfied", "Waits ended by a publication", _F.STORE),
    Stat("published_meanwhile", "Published before the lease was asked", _F.STORE),
    Stat("lease_takeovers", "Leases taken over", _F.STORE | _F.SHOWN),
    Stat("lease_timeouts", "Waits timed out", _F.STORE | _F.ERROR | _F.SHOWN),
    Stat("lease_lost", "Leases lost while compiling", _F.STORE | _F.ERROR),
    Stat("claims_taken_over", "Foreign claims taken over", _F.STORE | _F.ERROR | _F.SHOWN),
    # What happened to entries this node refused.
    Stat("replaced", "Refused entries replaced", _F.STORE | _F.SHOWN),
    Stat("publish_blocked", "Blocked (other key proof)",
         _F.STORE | _F.ERROR | _F.SHOWN),
    # Learned-index names a node did not read (beyond the newest layout.MAX_LEARNED).
    Stat("learned_cut", "Learned names left out", _F.STORE | _F.ERROR | _F.SHOWN),
    # What a node's capture counts after READY (node records, Prometheus `warmd_<id>_total`).
    Stat("runtime_jit", "Runtime JIT (after READY)", _F.CAPTURE | _F.ERROR),
    Stat("captured", "Entries captured and shared", _F.CAPTURE),
    Stat("capture_refused", "Captured entries refused (unsafe)", _F.CAPTURE | _F.ERROR),
    Stat("capture_failed", "Capture errors (per entry)", _F.CAPTURE | _F.ERROR),
    # What a trusted producer counts re-deriving claims (warmd.rederive).
    Stat("rederived", "Claims re-derived and published", _F.CAPTURE),
    Stat("rederived_differs", "of which not the claim's bytes", _F.CAPTURE | _F.DETAIL),
    Stat("rederive_refused", "Claims refused by re-derivation", _F.CAPTURE | _F.ERROR),
    Stat("rederive_quarantined", "Claims whose source is not the library's",
         _F.CAPTURE | _F.ERROR),
)
# HELP of the Prometheus counters derived from the table (warmd.cluster.metrics): every
# counter a warmup or a capture counts that is not a kernel outcome (those are one
# `warmd_kernels_total` by outcome).
HELP: dict[str, str] = {
    "tasks": "Warmup tasks run (a task is one JIT module, or one GEMM shape's kernels)",
    "tasks_failed": "Warmup tasks that failed",
    "compile_seconds": "Time spent compiling kernels",
    "compile_seconds_saved": "Compile time saved: what the kernels another node compiled "
                             "(installed from the shared cache) took to compile there",
    "fetch_seconds": "Time spent reading entries from the shared cache and checking digests",
    "install_seconds": "Time spent writing fetched entries into the local kernel caches",
    "verify_seconds": "Time spent checking kernels already on disk against their records",
    "corrupt_rejected": "Shared-cache entries refused as malformed, mismatched or corrupt",
    "bytes_fetched": "Bytes fetched from the shared cache",
    "bytes_published": "Bytes published to the shared cache",
    "runtime_jit": "Kernels the engine compiled after the node was READY (missed by warmup)",
    "captured": "Kernels compiled after READY that were captured and shared (or found shared)",
    "capture_refused": "Kernels compiled after READY refused for sharing (unsafe or too large)",
    "capture_failed": "Errors reading or sharing a captured entry (each counted, none fatal)",
    "rederived": "Captured entries a trusted producer rebuilt and published as learned entries",
    "rederived_differs": "Re-derived entries whose rebuilt bytes differ from the claim's "
                         "(the rebuilt ones are published)",
    "rederive_refused": "Captured entries the re-derivation refused (no source to rebuild "
                        "from, inputs outside what the library uses, a failed rebuild)",
    "rederive_quarantined": "Captured entries whose recorded source is not what the trusted "
                            "producer's library generates from their parameters (dropped)",
}
BY_ID = {s.id: s for s in COUNTERS}
# The columns of a counter listing: a label (at most LABEL_WIDTH - 1 characters, so that one
# space is left; tests/cli/test_screens.py holds every shown label to it), then the value.
LABEL_WIDTH = len("Corrupt entries rejected") + 2
VALUE_WIDTH = 12
BY_OUTCOME = {s.outcome: s for s in COUNTERS if s.outcome}


def compile_seconds_saved(outcome: Outcome, recorded: float, compiled_here: bool) -> float:
    """What a kernel's outcome saved: for a hit of someone else's compile (installed from
    the shared cache, in this run or an earlier one), what the compile took where it was
    built (`recorded`); a re-hit of this node's own compile saved nothing (the time was
    spent here, and counted as compile time), nor did a compile or a failure."""
    return recorded if outcome.is_hit and not compiled_here else 0.0


def help_text(stat: Stat) -> str:
    """The HELP of the counter's Prometheus metric."""
    return HELP[stat.id]


def select(flag: CounterFlag, without: CounterFlag = CounterFlag.NONE) -> tuple[Stat, ...]:
    """The counters with every flag in `flag` and none in `without`, in table order."""
    return tuple(s for s in COUNTERS if s.flags & flag == flag and not s.flags & without)


def ids(flag: CounterFlag, without: CounterFlag = CounterFlag.NONE) -> tuple[str, ...]:
    return tuple(s.id for s in select(flag, without))


def hit_rate(values: dict) -> float | None:
    """Hits over kernels of any counter mapping; None when there were no kernels."""
    total = sum(values.get(i, 0) for i in ids(CounterFlag.KERNEL))
    hits = sum(values.get(i, 0) for i in ids(CounterFlag.KERNEL | CounterFlag.HIT))
    return hits / total if total else None


class _CountersBase:
    """Methods of Counters (its fields come from the table)."""

    def add(self, other: Counters | dict) -> Counters:
        """Add another counter set (or a dict of some counters, e.g. from the store)."""
        values = other.to_json() if isinstance(other, _CountersBase) else other
        for f in fields(self):
            if f.name in values and values[f.name] is not None:
                cast = float if BY_ID[f.name].has(CounterFlag.TIME) else int
                setattr(self, f.name, getattr(self, f.name) + cast(values[f.name]))
        return self

    @property
    def kernels(self) -> int:
        return sum(getattr(self, i) for i in ids(CounterFlag.KERNEL))

    @property
    def hit_rate(self) -> float:
        """Hits over all kernels looked at; 0.0 when there were none."""
        return hit_rate(self.to_json()) or 0.0

    def kernel_counts(self) -> dict[str, int]:
        """{"total": kernels, and each outcome}: what a node record and `warmd status` show."""
        return {"total": self.kernels, **{i: getattr(self, i) for i in ids(CounterFlag.KERNEL)}}

    def to_json(self) -> dict:
        data = asdict(self)
        for name in ids(CounterFlag.RUN | CounterFlag.TIME):
            data[name] = round(data[name], 3)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Counters:
        return cls().add(data)

    def render_text(self, title: str = "warmd cache statistics") -> str:
        total = self.kernels
        rows = []
        for stat in select(CounterFlag.RUN):
            if stat.id == ids(CounterFlag.KERNEL)[0]:
                rows.append(("Kernels", f"{total}", ""))
            value = getattr(self, stat.id)
            kernel = stat.has(CounterFlag.KERNEL)
            share = f"({100.0 * value / total:5.1f}%)" if kernel and total else ""
            rows.append((_label(stat), format_value(stat, value), share))
            if stat.id == ids(CounterFlag.KERNEL)[-1]:
                rows.append(("Hit rate", f"{100.0 * self.hit_rate:.1f} %", ""))
        return "\n".join([title, *(counter_line(*row) for row in rows)])


Counters = make_dataclass(
    "Counters",
    [(s.id, float if s.has(CounterFlag.TIME) else int,
      field(default=0.0 if s.has(CounterFlag.TIME) else 0))
     for s in select(CounterFlag.RUN)],
    bases=(_CountersBase,))
Counters.__module__ = __name__
Counters.__doc__ = "One set of cache counters, for a warmup run and the cluster totals alike."


def counter_line(label: str, value: str, extra: str = "") -> str:
    """One line of a counter listing (`warmd status`, `warmd cache stats`, a warmup's
    summary): the label in LABEL_WIDTH, the value right-aligned in VALUE_WIDTH, then extra.
    Every label is shorter than LABEL_WIDTH, so every value ends in the same column."""
    return f"{label:<{LABEL_WIDTH}}{value:>{VALUE_WIDTH}} {extra}".rstrip()


def render_details(totals: dict) -> list[str]:
    """The store counters `warmd cache stats` lists under the Counters summary."""
    return [counter_line(_label(s), str(int(totals.get(s.id, 0))))
            for s in select(CounterFlag.SHOWN)]


def _label(stat: Stat) -> str:
    return f"  {stat.description}" if stat.has(CounterFlag.DETAIL) else stat.description


def format_value(stat: Stat, value: float) -> str:
    if stat.has(CounterFlag.TIME):
        return format_seconds(float(value))
    if stat.has(CounterFlag.BYTES):
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
