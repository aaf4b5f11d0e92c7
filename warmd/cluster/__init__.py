"""The daemon on Ray: a controller actor that gives every matching node one agent, agents that
warm their node through per-GPU workers, node states in Redis, metrics and structured logs.

    warmd start ──> controller (detached, named, on the head) ──reconcile──> one agent per node
                                                                     └──> num_gpus=1 workers
                                                                          (finish, free the GPU)
"""

RAY_NAMESPACE = "warmd"
CONTROLLER_NAME = "warmd-controller"


def agent_name(node_id: str) -> str:
    """The detached agent of one node: named after the node, so a restarted controller finds
    the agents that are still alive instead of starting twins."""
    return f"warmd-agent-{node_id}"
