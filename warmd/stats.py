"""One set of cache counters, for a warmup run and for the cluster-wide totals alike,
rendered as text (ccache/sccache style) or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

_INT_FIELDS = ("tasks", "tasks_failed", "local_hits", "remote_hits", "compiled", "failed",
               "corrupt_rejected", "bytes_fetched", "bytes_published")


@dataclass
class Counters:
    tasks: int = 0
    tasks_failed: int = 0
    local_hits: int = 0  # kernels already in the local cache
    remote_hits: int = 0  # kernels installed from the shared cache during the run
    compiled: int = 0
    failed: int = 0
    corrupt_rejected: int = 0  # shared entries refused: bad digest/signature/unsafe archive
    bytes_fetched: int = 0
    bytes_published: int = 0
    compile_seconds: float = 0.0
    compile_seconds_saved: float = 0.0  # what the hits took to compile where they were built

    def add(self, other: Counters | dict) -> Counters:
        """Add another counter set (or a dict of some counters, e.g. from the store)."""
        values = other.to_json() if isinstance(other, Counters) else other
        for f in fields(self):
            if f.name in values and values[f.name] is not None:
                cast = int if f.name in _INT_FIELDS else float
                setattr(self, f.name, getattr(self, f.name) + cast(values[f.name]))
        return self

    @property
    def kernels(self) -> int:
        return self.local_hits + self.remote_hits + self.compiled + self.failed

    @property
    def hit_rate(self) -> float:
        """Hits over all kernels looked at; 0.0 when there were none."""
        return (self.local_hits + self.remote_hits) / self.kernels if self.kernels else 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["compile_seconds"] = round(self.compile_seconds, 3)
        data["compile_seconds_saved"] = round(self.compile_seconds_saved, 3)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Counters:
        return cls().add(data)

    def render_text(self, title: str = "warmd cache statistics") -> str:
        total = self.kernels

        def share(n: int) -> str:
            return f"({100.0 * n / total:5.1f}%)" if total else ""

        rows = [
            ("Tasks", f"{self.tasks}", ""),
            ("  failed", f"{self.tasks_failed}", ""),
            ("Kernels", f"{total}", ""),
            ("  local hits", f"{self.local_hits}", share(self.local_hits)),
            ("  remote hits", f"{self.remote_hits}", share(self.remote_hits)),
            ("  compiled", f"{self.compiled}", share(self.compiled)),
            ("  failed", f"{self.failed}", share(self.failed)),
            ("Hit rate", f"{100.0 * self.hit_rate:.1f} %", ""),
            ("Compile time", format_seconds(self.compile_seconds), ""),
            ("Compile time saved", format_seconds(self.compile_seconds_saved), ""),
            ("Corrupt entries rejected", f"{self.corrupt_rejected}", ""),
            ("Fetched", format_bytes(self.bytes_fetched), ""),
            ("Published", format_bytes(self.bytes_published), ""),
        ]
        width = max(len(r[0]) for r in rows) + 2
        lines = [title]
        lines += [f"{label:<{width}}{value:>12} {extra}".rstrip() for label, value, extra in rows]
        return "\n".join(lines)


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
