"""The controller: one detached, named actor (namespace "warmd") on the head node.

Every few seconds it reconciles: each alive node that the config selects gets exactly one
agent, pinned to that node (hard node affinity) and named after it; agents that died are
replaced (the new one resumes from the node's and the cluster's cache); nodes that left are
forgotten, their records removed. It also pushes config changes to the agents and keeps the
latest record of every node for `warmd status`.
"""

from __future__ import annotations

import threading
import time

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from warmd.cluster import RAY_NAMESPACE, agent_name
from warmd.cluster.agent import NodeAgent
from warmd.cluster.logs import node_logger
from warmd.cluster.nodes import RayNode, list_nodes, wanted_nodes
from warmd.cluster.state import NodeState, node_records
from warmd.config import WarmdConfig, redact_url

HEALTH_TIMEOUT = 3.0
_Agent = ray.remote(NodeAgent)


class Controller:
    def __init__(self, config_json: dict, redis_url: str | None, info: dict | None = None
                 ) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.log = node_logger("controller", self.node_id)
        self.info = dict(info or {})
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.agents: dict[str, object] = {}
        self.records: dict[str, dict] = {}
        self.nodes: dict[str, RayNode] = {}
        self.counters = {"reconciles": 0, "agents_started": 0, "agents_replaced": 0,
                         "nodes_removed": 0, "errors": 0}
        self.last_error = ""
        self._configure(config_json, redis_url)
        self._thread = threading.Thread(target=self._loop, name="warmd-controller", daemon=True)
        self._thread.start()
        self.log.info("controller started", extra={"config_hash": self.config_hash,
                                                   "redis": redact_url(redis_url)})

    def _configure(self, config_json: dict, redis_url: str | None) -> None:
        self.config = WarmdConfig.from_json(config_json)
        self.redis_url = redis_url
        self.config_hash = self.config.work_hash()
        self.store = node_records(redis_url, self.config.redis.namespace)

    # --- called over Ray -----------------------------------------------------------------

    def apply(self, config_json: dict, redis_url: str | None, info: dict | None = None) -> dict:
        """A later `warmd start`: take its config (agents re-warm when the work changed)."""
        with self._lock:
            old = self.config_hash
            if self.config.redis.namespace != WarmdConfig.from_json(config_json).redis.namespace:
                self.store.delete_daemon()
            self._configure(config_json, redis_url)
            self.info.update(info or {})
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
                        "store_size": self.store.server_size()},
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
        stops = {nid: a.shutdown.remote() for nid, a in agents.items()}
        ray.wait(list(stops.values()), num_returns=len(stops), timeout=10)
        for handle in agents.values():
            ray.kill(handle, no_restart=True)
        with self._lock:
            for nid in list(self.records):
                self.store.delete(nid)
            self.records.clear()
            self.store.delete_daemon()
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
            self._wake.wait(timeout=self.config.agent.reconcile_seconds)
            self._wake.clear()

    def reconcile(self) -> None:
        with self._lock:
            config, url = self.config, self.redis_url
        wanted = wanted_nodes(list_nodes(), config)
        for node_id in set(self.agents) | set(self.records):
            if node_id not in wanted:
                self._forget(node_id)
        for node_id, node in wanted.items():
            if node_id not in self.agents:
                self._spawn(node, config, url)
        self._poll(config, url)
        self.nodes = wanted
        self.counters["reconciles"] += 1
        self.store.put_daemon({"config_hash": self.config_hash, "nodes": sorted(wanted),
                               "controller_node": self.node_id, "updated": time.time(),
                               "config": config.public_json()})

    def _spawn(self, node: RayNode, config: WarmdConfig, url: str | None) -> None:
        handle = _Agent.options(
            name=agent_name(node.node_id), namespace=RAY_NAMESPACE, lifetime="detached",
            get_if_exists=True, num_cpus=0, num_gpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote(node.to_json(), config.public_json(), url)
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
                ray.kill(handle, no_restart=True)
            except Exception as exc:  # its node is gone: so is the agent
                self.log.debug("kill of a departed agent failed: %s", exc)
        self.store.delete(node_id)
        self.counters["nodes_removed"] += 1
        self.log.info("node forgotten", extra={"for_node": node_id})

    def _poll(self, config: WarmdConfig, url: str | None) -> None:
        with self._lock:
            agents = dict(self.agents)
        refs = {a.health.remote(): nid for nid, a in agents.items()}
        if not refs:
            return
        ray.wait(list(refs), num_returns=len(refs), timeout=HEALTH_TIMEOUT)
        for ref, node_id in refs.items():
            try:
                record = ray.get(ref, timeout=0)
            except GetTimeoutError:
                continue  # busy or still starting; ask again next round
            except ActorDiedError as exc:
                self._replace(node_id, exc)
                continue
            except Exception as exc:  # unavailable for a moment (its node is restarting)
                self.log.debug("agent health failed: %s", exc, extra={"for_node": node_id})
                continue
            with self._lock:
                if node_id in self.agents:
                    self.records[node_id] = record
            if record.get("target_hash") != self.config_hash:
                agents[node_id].set_config.remote(config.public_json(), url)

    def _replace(self, node_id: str, exc: Exception) -> None:
        """The agent died (killed, crashed): the next round starts a new one on the node."""
        with self._lock:
            self.agents.pop(node_id, None)
        self.counters["agents_replaced"] += 1
        self.log.warning("agent died; starting a new one",
                         extra={"for_node": node_id, "why": str(exc).splitlines()[0][:200]})
        self._wake.set()
