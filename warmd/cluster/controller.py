"""The controller: one detached, named actor (namespace "warmd") on the head node.

It reconciles every few seconds, and at once when a node joins or leaves the cluster (it
looks at Ray's node list every NODE_POLL_SECONDS): each alive node that the config selects
gets exactly one agent, pinned to that node (hard node affinity) and named after it; agents
that died are replaced (the new one resumes from the node's and the cluster's cache); nodes
that left are forgotten, their records removed. It also pushes config changes to the agents
and keeps the latest record of every node for `warmd status`.
"""

from __future__ import annotations

import threading
import time

from warmd.cluster import ray_api
from warmd.cluster.decisions import (
    Forget,
    Reconfigure,
    Record,
    Replace,
    Spawn,
    nodes_changed,
    reconcile,
)
from warmd.cluster.logs import node_logger
from warmd.cluster.nodes import RayNode, selection_problem, wanted_nodes
from warmd.cluster.state import NodeState, node_records
from warmd.config import WarmdConfig, redact_url
from warmd.config.parse import config_from_json

HEALTH_TIMEOUT = 3.0
NODE_POLL_SECONDS = 0.25  # how soon a node that joined gets its agent


class Controller:
    def __init__(self, config_json: dict, redis_url: str | None, info: dict | None = None
                 ) -> None:
        self.node_id = ray_api.current_node_id()
        self.log = node_logger("controller", self.node_id)
        self.info = dict(info or {})
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.agents: dict[str, ray_api.AgentHandle] = {}
        self.records: dict[str, dict] = {}
        self.nodes: dict[str, RayNode] = {}
        self.alive: set[str] = set()  # alive node ids at the last round
        self.counters = {"reconciles": 0, "agents_started": 0, "agents_replaced": 0,
                         "nodes_removed": 0, "errors": 0}
        self.last_error = ""
        self.no_node = ""  # why the config selects no node, after a round that found none
        self.reconciled_hash = ""  # the config of the last round: no_node and nodes are its
        self._configure(config_json, redis_url)
        self.metrics_url = self._serve_metrics()
        self._thread = threading.Thread(target=self._loop, name="warmd-controller", daemon=True)
        self._thread.start()
        self.log.info("controller started", extra={"config_hash": self.config_hash,
                                                   "redis": redact_url(redis_url)})

    def _serve_metrics(self) -> str:
        """The cluster's gauges on the port after the agents' (9465 by default; a taken
        port, or agent.metrics_port 0, gets any free one): its URL."""
        from warmd.cluster.metrics import ControllerMetrics

        def records() -> list[dict]:
            with self._lock:
                return [dict(r) for r in self.records.values()]

        self.metrics = ControllerMetrics(records, lambda: dict(self.counters))
        wanted = self.config.agent.metrics_port
        self.metrics.serve(wanted + 1 if 0 < wanted < 65535 else 0)
        return self.metrics.endpoint_url(ray_api.current_node_ip())

    def _configure(self, config_json: dict, redis_url: str | None) -> None:
        self.config = config_from_json(config_json)
        self.redis_url = redis_url
        self.config_hash = self.config.work_hash()
        self.store = node_records(redis_url, self.config.redis.namespace)

    # --- called over Ray -----------------------------------------------------------------

    def apply(self, config_json: dict, redis_url: str | None, info: dict | None = None) -> dict:
        """A later `warmd start`: take its config (agents re-warm when the work changed)."""
        with self._lock:
            old = self.config_hash
            if self.config.redis.namespace != config_from_json(config_json).redis.namespace:
                self.store.delete_daemon()
            self._configure(config_json, redis_url)
            self.info.update(info or {})
            if self.config_hash != self.reconciled_hash:  # until a round ran with it
                self.no_node = ""
        self.log.info("config applied", extra={"config_hash": self.config_hash,
                                               "changed": old != self.config_hash})
        self._wake.set()
        return {"config_hash": self.config_hash, "changed": old != self.config_hash}

    def snapshot(self) -> dict:
        with self._lock:
            records = [dict(self.records[n]) for n in sorted(self.records)]
            return {"controller": {
                        "node_id": self.node_id, "started_at": self.started_at,
                        "config_hash": self.config_hash, "config": self.config.public_json(),
                        "redis": redact_url(self.redis_url), "counters": dict(self.counters),
                        "last_error": self.last_error, "info": self.info,
                        "no_node": self.no_node, "reconciled_hash": self.reconciled_hash,
                        "metrics_url": self.metrics_url,
                        "store_size": self.store.server_size(),
                        "key_proof": self.store.key_proof(self.config.signing_key_file)},
                    "nodes": records}

    def shutdown(self) -> dict:
        """Stop reconciling, stop and remove every agent, drop the node records. The kernel
        caches (local and shared) are not touched."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        with self._lock:
            agents = dict(self.agents)
            self.agents.clear()
        ray_api.shutdown_agents(agents, timeout=10)
        ray_api.kill_peer_directory()  # the agents served their blobs through it
        with self._lock:
            for nid in list(self.records):
                self.store.delete(nid)
            self.records.clear()
            self.store.delete_daemon()
        self.metrics.close()
        self.log.info("controller stopped", extra={"agents_stopped": len(agents)})
        return {"agents_stopped": len(agents)}

    def ping(self) -> str:
        return self.config_hash

    # --- reconcile -----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as exc:  # one bad round must not stop the controller
                self.counters["errors"] += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self.log.exception("reconcile failed")
            self._until_next_round(self.config.agent.reconcile_seconds)

    def _until_next_round(self, period: float) -> None:
        """Wait out the period, unless woken, or a node joins or leaves meanwhile."""
        deadline = time.monotonic() + period
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wake.wait(timeout=min(NODE_POLL_SECONDS, left)):
                break
            try:
                alive = {n.node_id for n in ray_api.list_nodes() if n.alive}
            except Exception:  # Ray busy for a moment: the period still ends the wait
                continue
            if nodes_changed(self.alive, alive):
                break
        self._wake.clear()

    def reconcile(self) -> None:
        """One round: look at the cluster and the agents, decide (decisions.reconcile), act."""
        with self._lock:
            config, url, config_hash = self.config, self.redis_url, self.config_hash
            agents, records = dict(self.agents), dict(self.records)
        nodes = ray_api.list_nodes()
        self.alive = {n.node_id for n in nodes if n.alive}
        wanted = wanted_nodes(nodes, config)
        self.no_node = selection_problem(nodes, config) or ""
        health = ray_api.poll_health(agents, HEALTH_TIMEOUT)
        for action in reconcile(wanted, health, records, config_hash):
            self._apply(action, config, url)
        self.nodes = wanted
        self.reconciled_hash = config_hash
        self.counters["reconciles"] += 1
        self.store.put_daemon({"config_hash": config_hash, "nodes": sorted(wanted),
                               "controller_node": self.node_id, "updated": time.time(),
                               "config": config.public_json()})

    def _apply(self, action, config: WarmdConfig, url: str | None) -> None:
        if isinstance(action, Forget):
            self._forget(action.node_id)
        elif isinstance(action, Replace):
            self._replace(action.node_id, action.why)
        elif isinstance(action, Record):
            with self._lock:
                if action.node_id in self.agents:
                    self.records[action.node_id] = action.record
        elif isinstance(action, Reconfigure):
            handle = self.agents.get(action.node_id)
            if handle is not None:
                handle.set_config(config.public_json(), url)
        elif isinstance(action, Spawn):
            self._spawn(action.node, config, url)

    def _spawn(self, node: RayNode, config: WarmdConfig, url: str | None) -> None:
        from warmd.cluster.agent import NodeAgent  # the agents' code: loaded when one starts

        handle = ray_api.AgentHandle.spawn(NodeAgent, node, config.public_json(), url)
        with self._lock:
            self.agents[node.node_id] = handle
            if node.node_id not in self.records:
                pending = NodeState(node.node_id, ip=node.ip, gpus=node.gpus,
                                    gpu_type=node.gpu_type, role=node.role())
                self.records[node.node_id] = pending.to_json()
        self.counters["agents_started"] += 1
        self.log.info("agent scheduled", extra={"for_node": node.node_id, "ip": node.ip,
                                                "gpus": node.gpus, "role": node.role()})

    def _forget(self, node_id: str) -> None:
        """A node that left the cluster (or no longer matches): drop its agent and record."""
        with self._lock:
            handle = self.agents.pop(node_id, None)
            self.records.pop(node_id, None)
        if handle is not None:
            try:
                handle.kill()
            except Exception as exc:  # its node is gone: so is the agent
                self.log.debug("kill of a departed agent failed: %s", exc)
        self.store.delete(node_id)
        self.counters["nodes_removed"] += 1
        self.log.info("node forgotten", extra={"for_node": node_id})

    def _replace(self, node_id: str, why: str) -> None:
        """The agent died (killed, crashed): the next round starts a new one on the node."""
        with self._lock:
            self.agents.pop(node_id, None)
        self.counters["agents_replaced"] += 1
        self.log.warning("agent died; starting a new one", extra={"for_node": node_id,
                                                                  "why": why})
        self._wake.set()
