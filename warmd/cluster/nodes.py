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


def wanted_nodes(nodes: list[RayNode], config: WarmdConfig) -> dict[str, RayNode]:
    """The alive nodes that should have an agent under this config, by node id."""
    return {n.node_id: n for n in nodes
            if n.alive and config.nodes.matches(n.labels, n.gpus, n.gpu_type,
                                                config.builders.enabled)}


def selection_problem(nodes: list[RayNode], config: WarmdConfig) -> str | None:
    """Why the config selects no node of the cluster, and what to change; None when it
    selects one."""
    if wanted_nodes(nodes, config):
        return None
    alive = [n for n in nodes if n.alive]
    gpu = [n for n in alive if n.gpus > 0]
    if not alive:
        return "the config selects no node: the Ray cluster has no alive node"
    if not gpu and not config.builders.enabled:
        return (f"the config selects no node: none of the {len(alive)} node(s) has a GPU and "
                "builders are disabled; set `builders: {enabled: true}` in the config to build "
                "kernels on CPU nodes, or add GPU nodes")
    kinds = sorted({n.gpu_type or "unknown type" for n in gpu})
    have = [f"{len(gpu)} GPU node(s) ({', '.join(kinds)})"] if gpu else []
    have += [f"{len(alive) - len(gpu)} CPU node(s)"] if len(alive) > len(gpu) else []
    wanted = [f"gpu_types {list(config.nodes.gpu_types)}"] if config.nodes.gpu_types else []
    wanted += [f"labels {dict(config.nodes.labels)}"] if config.nodes.labels else []
    return (f"the config selects no node: its {' and '.join(wanted)} match none of the "
            f"{' and '.join(have)}; change `nodes:` in the config")
