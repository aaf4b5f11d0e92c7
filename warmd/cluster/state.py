"""Per-node state machine and where it is kept: the agent's memory (served to the controller
over Ray) and the store's node records (for any process, Ray or not; see node_records).

    PENDING ──> WARMING ──> READY | DEGRADED | FAILED ──(config changed, agent restarted)──┐
                   ^────────────────────────────────────────────────────────────────────┘

READY: every task of every model is warm and the shared cache worked. DEGRADED: every task is
warm, but the shared cache was unreachable or refused work (the reason says which), so some
kernels were compiled locally that the cluster may already have had. FAILED: a model could not
be planned on this node (its path is missing here, say) or a task failed; the reason says which.
"""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from warmd.coordination import BootReport
from warmd.stats import CounterFlag, hit_rate, ids

if TYPE_CHECKING:
    from warmd.store import NodeRecords


class NodeStatus(enum.StrEnum):
    """A node's state (its value is what records, JSON and the tables show)."""

    PENDING = "PENDING"
    WARMING = "WARMING"
    READY = "READY"
    DEGRADED = "DEGRADED"
    FAILED = "FAILED"


# The members by their short names (the state machine below reads them so).
PENDING, WARMING, READY, DEGRADED, FAILED = (NodeStatus.PENDING, NodeStatus.WARMING,
                                             NodeStatus.READY, NodeStatus.DEGRADED,
                                             NodeStatus.FAILED)
WARM_STATES = frozenset({READY, DEGRADED})
_NEXT = {
    PENDING: {WARMING, FAILED},
    WARMING: {READY, DEGRADED, FAILED},
    READY: {WARMING},
    DEGRADED: {WARMING},
    FAILED: {WARMING},
}
# a node record's kernels: what `warmd status` shows
KERNEL_COUNTS = ("total", *ids(CounterFlag.KERNEL))


class BadTransition(RuntimeError):
    """A state change the machine does not allow: a bug, never user input."""


def zero_kernels() -> dict[str, int]:
    return dict.fromkeys(KERNEL_COUNTS, 0)


@dataclass
class NodeState:
    node_id: str  # Ray's id of the node (new on every Ray restart)
    ip: str = ""
    gpus: int = 0
    gpu_type: str | None = None
    role: str = "gpu"
    serves: bool | None = None  # watched for runtime JIT (warmd.cluster.work.node_serves)
    state: NodeStatus = PENDING
    reason: str = ""
    progress_done: int = 0
    progress_total: int = 0
    plans: dict = field(default_factory=dict)  # model name -> plan key
    config_hash: str = ""
    kernels: dict = field(default_factory=zero_kernels)
    compile_seconds: float = 0.0  # spent compiling in the last warmup
    saved_seconds: float = 0.0  # compile time the cache hits of the last warmup avoided
    warm_seconds: float = 0.0  # duration of the last warmup
    warmed_at: float | None = None
    heartbeat: float = 0.0
    agent: str = ""
    metrics_url: str | None = None
    store: str = "ok"
    cache_bytes: dict = field(default_factory=dict)  # library -> bytes on this node
    counters: dict = field(default_factory=dict)  # warmd.stats.Counters of the last warmup
    changed_at: float = field(default_factory=time.time)
    name: str = ""  # the machine's stable name (settings.node_name)
    # entries compiled after READY (warmd.capture): library -> count, and the last events
    runtime_jit: dict = field(default_factory=dict)
    runtime_jit_events: list = field(default_factory=list)  # RuntimeJit.to_json(), newest last
    capture: dict = field(default_factory=dict)  # mode, captured, capture_refused, learned
    # the cluster's work in the last warmup, summed over models: kernels compiled here,
    # installed from peers, waited for, and when (None: no warmup with a shared cache yet)
    boot: BootReport | None = None
    building: dict = field(default_factory=dict)  # what builds here now -> when it began

    @property
    def runtime_jit_total(self) -> int:
        return sum(int(v) for v in self.runtime_jit.values())

    def __post_init__(self) -> None:
        self.state = NodeStatus(self.state)  # read back from JSON as its value

    def matches(self, wanted: str) -> bool:
        """--node-id takes a node id, a unique prefix of one, the node's IP address or its
        stable name."""
        return self.node_id.startswith(wanted) or wanted in (self.ip, self.name)

    def transition(self, new: NodeStatus, reason: str = "") -> None:
        new = NodeStatus(new)
        if new not in _NEXT.get(self.state, set()):
            raise BadTransition(f"node {self.node_id[:8]}: {self.state} -> {new}")
        self.state, self.reason, self.changed_at = new, reason, time.time()

    @property
    def hit_rate(self) -> float:
        return hit_rate(self.kernels) or 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["boot"] = self.boot.to_json() if self.boot is not None else {}
        data["hit_rate"] = round(self.hit_rate, 4)
        return data

    @classmethod
    def from_json(cls, data: dict) -> NodeState:
        known = {f.name for f in fields(cls)}
        node = cls(**{k: v for k, v in data.items() if k in known and k != "boot"})
        node.boot = BootReport.from_json(data["boot"]) if data.get("boot") else None
        return node


def node_records(url: str | None, namespace: str, ttl: float = 120.0) -> NodeRecords:
    """The node records of one namespace (kept by the store: warmd.store.NodeRecords), read
    back as NodeState. No URL or 'off': nothing is kept, and last_error says so."""
    from warmd.store import open_node_records

    return open_node_records(url, namespace, ttl, decode=NodeState.from_json)
