"""What `warmd status`, `wait-ready` and `start --wait` look at: one typed snapshot of the
daemon, from the controller over Ray or from the node records in Redis. The controller's
answer and the stored records arrive as JSON (the Ray and Redis edges) and are read into
these types once; `to_json` is what `--json` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.cluster.state import WARM_STATES, NodeState, NodeStatus
from warmd.coordination import BootReport
from warmd.stats import Counters

# what the boot view counts of each node's share of the cluster's work (its failures show
# in the node's state)
BOOT_KEYS = tuple(name for name in BootReport.counts() if name != "failed")


@dataclass(frozen=True)
class StoreSize:
    """The store's memory and keys, and its capacity: maxmemory (0: none set) and what the
    server evicts when full."""

    used_memory: int
    keys: int
    maxmemory: int = 0
    maxmemory_policy: str = ""

    @classmethod
    def from_json(cls, data: dict | None) -> StoreSize | None:
        if not data:
            return None
        return cls(int(data.get("used_memory") or 0), int(data.get("keys") or 0),
                   int(data.get("maxmemory") or 0), str(data.get("maxmemory_policy") or ""))

    def to_json(self) -> dict:
        return {"used_memory": self.used_memory, "keys": self.keys,
                "maxmemory": self.maxmemory, "maxmemory_policy": self.maxmemory_policy}


@dataclass(frozen=True)
class KeyProofView:
    """The store's key proof as the controller's signing key finds it (warmd.store.keyproof):
    "missing" or "foreign" is an alarm: no node heals refused entries, and a node whose key
    is not the proof's publishes nothing."""

    state: str
    alarm: bool = False
    describe: str = ""

    @classmethod
    def from_json(cls, data: dict | None) -> KeyProofView | None:
        if not data:
            return None
        return cls(str(data.get("state") or "unknown"), bool(data.get("alarm")),
                   str(data.get("describe") or ""))

    def to_json(self) -> dict:
        return {"state": self.state, "alarm": self.alarm, "describe": self.describe}


@dataclass(frozen=True)
class ControllerView:
    """The running controller (over Ray) or the summary it last stored (in Redis)."""

    record: dict  # as received: what --json prints
    node_id: str = "?"
    started_at: float | None = None
    config_hash: str | None = None
    redis: str | None = None
    namespace: str | None = None
    no_node: str | None = None
    reconciles: int = 0
    reconciled_hash: str | None = None  # the config its last reconcile ran with

    @property
    def reconciled(self) -> bool:
        """Whether a reconcile ran with the current config (its nodes are that config's)."""
        return bool(self.config_hash) and self.reconciled_hash == self.config_hash

    @classmethod
    def from_json(cls, data: dict | None) -> ControllerView | None:
        if data is None:
            return None
        config = data.get("config") or {}
        return cls(record=data, node_id=data.get("node_id") or "?",
                   started_at=data.get("started_at"), config_hash=data.get("config_hash"),
                   redis=data.get("redis"), namespace=(config.get("redis") or {}).get(
                       "namespace"), no_node=data.get("no_node") or None,
                   reconciles=int((data.get("counters") or {}).get("reconciles", 0)),
                   reconciled_hash=data.get("reconciled_hash") or None)


@dataclass(frozen=True)
class StatusSnapshot:
    running: bool  # a controller answered over Ray
    source: str  # "ray", "redis" (node records) or "none"
    nodes: tuple[NodeState, ...] = ()
    controller: ControllerView | None = None
    ray_address: str | None = None
    store_size: StoreSize | None = None
    redis: str | None = None  # where the records were read (not running)
    redis_error: str | None = None
    embedded_dir: str | None = None  # a stopped embedded server's data directory
    key_proof: KeyProofView | None = None  # None: no store, or not asked
    records: tuple[dict, ...] = field(default=(), repr=False)  # the nodes as received

    @classmethod
    def from_json(cls, data: dict) -> StatusSnapshot:
        records = tuple(data.get("nodes") or ())
        return cls(running=bool(data.get("running")), source=data.get("source", "none"),
                   nodes=tuple(NodeState.from_json(r) for r in records),
                   controller=ControllerView.from_json(data.get("controller")),
                   ray_address=data.get("ray_address"),
                   store_size=StoreSize.from_json(data.get("store_size")),
                   redis=data.get("redis"), redis_error=data.get("redis_error") or None,
                   embedded_dir=data.get("embedded_dir"),
                   key_proof=KeyProofView.from_json(data.get("key_proof")), records=records)

    @property
    def no_node(self) -> str | None:
        """Why the running controller's config selects no node (None: it selects some, or
        no reconcile ran with it yet)."""
        ctl = self.controller
        return ctl.no_node if self.running and ctl and ctl.reconciled else None

    @property
    def ready(self) -> bool:
        return self.running and all(n.state == NodeStatus.READY for n in self.nodes)

    def matching(self, wanted: str | None) -> list[NodeState]:
        """The nodes `--node-id wanted` names (every node for None)."""
        return [n for n in self.nodes if wanted is None or n.matches(wanted)]

    def totals(self) -> Counters:
        total = Counters()
        for node in self.nodes:
            total.add(node.counters or {})
        return total

    @property
    def runtime_jit(self) -> int:
        return sum(n.runtime_jit_total for n in self.nodes)

    def runtime_jit_events(self) -> list[dict]:
        """Every node's recorded runtime JIT events (library, entry, node, at), oldest
        first."""
        return sorted((e for n in self.nodes for e in n.runtime_jit_events),
                      key=lambda e: e.get("at") or 0)

    def settled(self, wanted: str | None) -> bool | None:
        """Whether the nodes waited for are warm (True), one failed (False), or they are
        not settled yet for the current config (None)."""
        nodes = self.matching(wanted)
        if wanted is None and self.running and self.controller and \
                self.controller.reconciled and not self.nodes:
            return True  # the current config selects nothing: nothing to wait for
        current = self.controller.config_hash if self.controller else None
        done = [n for n in nodes if n.state in WARM_STATES | {NodeStatus.FAILED}
                and (not current or n.config_hash == current)]
        if nodes and len(done) == len(nodes):  # warm or failed for the current config
            return all(n.state in WARM_STATES for n in nodes)
        return None

    def boot(self) -> dict:
        """The cluster boot as the nodes did it: per node kernels compiled here, installed
        from peers, waited for, and its warmup's length and timeline; and the sums."""
        boots = [n.boot or BootReport() for n in self.nodes]
        nodes = [{"node": n.name or n.node_id[:8], "node_id": n.node_id, "state": n.state,
                  "warm_seconds": n.warm_seconds, "warmed_at": n.warmed_at,
                  **{k: getattr(boot, k) for k in BOOT_KEYS}, "timeline": boot.timeline}
                 for n, boot in zip(self.nodes, boots, strict=True)]
        total = {k: sum(int(n[k]) for n in nodes) for k in BOOT_KEYS}
        ends = [n.warmed_at for n in self.nodes if n.warmed_at]
        starts = [n.warmed_at - n.warm_seconds for n in self.nodes if n.warmed_at]
        return {**total, "span_seconds": round(max(ends) - min(starts), 3) if ends else None,
                "nodes": nodes}

    def to_json(self) -> dict:
        counters = self.totals()
        summary = counters.to_json()
        summary["kernels"] = counters.kernels
        summary["hit_rate"] = round(counters.hit_rate, 4)
        summary["runtime_jit"] = self.runtime_jit
        summary["store_size"] = None if self.store_size is None else self.store_size.to_json()
        return {"running": self.running, "source": self.source,
                "ray_address": self.ray_address, "ready": self.ready,
                "controller": self.controller.record if self.controller else None,
                "nodes": list(self.records), "totals": summary, "boot": self.boot(),
                "runtime_jit": self.runtime_jit_events(),
                "key_proof": self.key_proof.to_json() if self.key_proof else None}
