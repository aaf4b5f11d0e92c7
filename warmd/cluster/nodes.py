"""Ray nodes as warmd sees them: id, address, GPUs, labels, and whether they get an agent."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.config import WarmdConfig

ACCELERATOR_PREFIX = "accelerator_type:"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
HEAD_RESOURCE = "node:__internal_head__"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    alive: bool
    gpus: int
    gpu_type: str | None
    labels: dict = field(default_factory=dict, hash=False, compare=False)
    is_head: bool = False

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    @classmethod
    def from_ray(cls, info: dict) -> RayNode:
        """From one entry of ray.nodes()."""
        resources = info.get("Resources") or {}
        labels = dict(info.get("Labels") or {})
        gpu_type = labels.get(ACCELERATOR_LABEL) or next(
            (k[len(ACCELERATOR_PREFIX):] for k in resources if k.startswith(ACCELERATOR_PREFIX)),
            None)
        return cls(node_id=info["NodeID"], ip=info.get("NodeManagerAddress", ""),
                   alive=bool(info.get("Alive")), gpus=int(resources.get("GPU", 0)),
                   gpu_type=gpu_type, labels=labels, is_head=HEAD_RESOURCE in resources)

    def role(self) -> str:
        """gpu: warmed on its GPUs; builder: no GPU, builds FlashInfer modules on CPU."""
        return "gpu" if self.gpus > 0 else "builder"

    def to_json(self) -> dict:
        return {"node_id": self.node_id, "ip": self.ip, "gpus": self.gpus,
                "gpu_type": self.gpu_type, "role": self.role(), "is_head": self.is_head}


def list_nodes() -> list[RayNode]:
    """Every node Ray knows, alive or dead (needs a connected Ray)."""
    import ray

    return [RayNode.from_ray(info) for info in ray.nodes()]


def wanted_nodes(nodes: list[RayNode], config: WarmdConfig) -> dict[str, RayNode]:
    """The alive nodes that should have an agent under this config, by node id."""
    return {n.node_id: n for n in nodes
            if n.alive and config.nodes.matches(n.labels, n.gpus, n.gpu_type,
                                                config.builders.enabled)}
