"""The node agent: one detached actor per node, pinned to it, that keeps the node warm.

It holds no GPU itself (num_cpus=0, num_gpus=0). Each warmup runs as short-lived Ray tasks
on the same node, one per GPU (num_gpus=1, each warming its share of the tasks), or one CPU
builder task on a node without GPUs. The tasks run in worker processes that exit when done
(max_calls=1), so their CUDA contexts and GPU memory are gone before serving starts.

The agent re-warms when the controller hands it a config whose work hash differs, writes its
record to Redis on every change and heartbeat, and serves Prometheus metrics.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from warmd import settings
from warmd.capture.watch import MAX_EVENTS
from warmd.cluster import ray_api
from warmd.cluster.decisions import RetryBackoff
from warmd.cluster.fanout import join_peers
from warmd.cluster.logs import node_logger
from warmd.cluster.metrics import AgentMetrics
from warmd.cluster.state import WARM_STATES, NodeState, NodeStatus, node_records
from warmd.cluster.work import (
    ModelResult,
    NodeWarm,
    node_context,
    node_serves,
    summarize,
    warm_node,
)
from warmd.config import WarmdConfig
from warmd.config.parse import config_from_json
from warmd.context import NodeContext

if TYPE_CHECKING:
    from warmd.capture.scope import CaptureScope

RETRY_FIRST, RETRY_MAX = 30.0, 600.0  # seconds before a FAILED node warms again, doubling


def warm_shard(config_json: dict, builder: bool, shard: int, shards: int,
               redis_url: str | None, node_name: str, agent=None,
               serves: bool | None = None) -> dict:
    """One worker's share of the node's warmup (runs as a Ray task on the agent's node, in
    a process of its own: the top of its work, which builds its context)."""
    config = config_from_json(config_json)
    context = node_context(config, node_name)
    log = node_logger("worker", ray_api.current_node_id())

    def progress(model: str, done: int, total: int) -> None:
        if agent is not None:
            ray_api.call_later(agent.report_progress, shard, model, done, total)

    log.info("warming shard %d/%d", shard + 1, shards, extra={"builder": builder})
    def building(label: str, begun: bool) -> None:
        if agent is not None:
            ray_api.call_later(agent.report_building, label, begun)

    result = warm_node(config, context, builder=builder, shard=shard, shards=shards,
                       redis_url=redis_url, progress=progress, serves=serves,
                       building=building)
    log.info("shard %d/%d done in %.1fs", shard + 1, shards, result.seconds,
             extra={"models": [(m.name, m.ok) for m in result.models]})
    return result.to_json()  # what crosses Ray



class NodeAgent:
    """Created by the controller with the node's facts, the config and the store URL."""

    def __init__(self, node: dict, config_json: dict, redis_url: str | None) -> None:
        self.node_id = node["node_id"]
        self.log = node_logger("agent", self.node_id)
        self.config = config_from_json(config_json)
        self.redis_url = redis_url
        self.target_hash = self.config.work_hash()
        self.node_name = settings.node_name()
        self.state = NodeState(self.node_id, ip=node.get("ip", ""), gpus=int(node.get("gpus", 0)),
                               gpu_type=node.get("gpu_type"), role=node.get("role", "gpu"),
                               name=self.node_name, agent=ray_api.current_actor_id(),
                               heartbeat=time.time())
        self.store = node_records(redis_url, self.config.redis.namespace,
                                ttl=max(60.0, 6 * self.config.agent.heartbeat_seconds))
        self.metrics = AgentMetrics(self.node_name)
        host = self.config.agent.metrics_host
        port = self.metrics.serve(self.config.agent.metrics_port, host)
        shown = host if host not in ("0.0.0.0", "::") else (self.state.ip or "127.0.0.1")
        shown = f"[{shown}]" if ":" in shown else shown
        self.state.metrics_url = f"http://{shown}:{port}/metrics"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._progress: dict[tuple[int, str], tuple[int, int]] = {}
        self.retry = RetryBackoff(RETRY_FIRST, RETRY_MAX)
        self.capture = None  # warmd.capture.watch.Capture while the node is warm
        self.rederiver = None  # warmd.rederive.Rederiver on a trusted producer, while warm
        # other nodes serve the blobs they verified, this one too (warmd.cluster.fanout)
        self.peers = join_peers(self.node_id)
        self._publish()
        self._thread = threading.Thread(target=self._loop, name="warmd-agent", daemon=True)
        self._thread.start()
        self.log.info("agent started", extra={"gpus": self.state.gpus, "role": self.state.role,
                                              "metrics": self.state.metrics_url})

    # --- called over Ray -----------------------------------------------------------------

    def health(self) -> dict:
        with self._lock:
            record = self.state.to_json()
        record["target_hash"] = self.target_hash
        record["alive"] = self._thread.is_alive()
        record["running_on"] = ray_api.current_node_id()
        return record

    def set_config(self, config_json: dict, redis_url: str | None) -> str:
        """Take a new config; a different work hash means a re-warm (after the current one)."""
        config = config_from_json(config_json)
        with self._lock:
            changed = config.work_hash() != self.target_hash or redis_url != self.redis_url
            self.config, self.redis_url = config, redis_url
            self.target_hash = config.work_hash()
            if (redis_url, config.redis.namespace) != (self.store.url, self.store.namespace):
                self.store.close()
                self.store = node_records(redis_url, config.redis.namespace, self.store.ttl)
        if changed:
            self.log.info("config changed; re-warming", extra={"config_hash": self.target_hash})
            self._wake.set()
        return self.target_hash

    def report_progress(self, shard: int, model: str, done: int, total: int) -> None:
        with self._lock:
            self._progress[(shard, model)] = (done, total)
            self.state.progress_done = sum(d for d, _ in self._progress.values())
            self.state.progress_total = sum(t for _, t in self._progress.values())

    def report_building(self, label: str, begun: bool) -> None:
        """A kernel or module whose build on this node began (or ended): in the record
        while it builds, with when it began."""
        with self._lock:
            building = dict(self.state.building)
            if begun:
                building[label] = time.time()
            else:
                building.pop(label, None)
            self.state.building = building
        if begun:
            self._publish()  # seen now, not at the next heartbeat

    def shutdown(self) -> bool:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._stop_capture()
        if self.peers is not None:
            self.peers.close()
        self.metrics.close()
        self.store.close()
        self.log.info("agent stopped")
        return True

    # --- the agent's own thread ----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._due():
                try:
                    self._warm()
                except Exception as exc:  # a bug must not kill the agent: report it
                    self.log.exception("warmup crashed")
                    self._finish_failed(f"warmup crashed: {type(exc).__name__}: {exc}")
            self._publish()
            self._wake.wait(timeout=self.config.agent.heartbeat_seconds)
            self._wake.clear()

    def _due(self) -> bool:
        """A new config, or a FAILED node whose retry time has come (the failure may have
        been passing: a worker lost with its node's memory, a file not there yet)."""
        if self.state.config_hash != self.target_hash:
            return True
        return self.state.state == NodeStatus.FAILED and self.retry.due()

    def _schedule_retry(self) -> None:
        if self.state.state == NodeStatus.FAILED:
            self.retry.failed()
        else:
            self.retry.succeeded()

    def _warm(self) -> None:
        self._stop_capture()  # what the warmup compiles and installs is not runtime JIT
        with self._lock:
            config, url, target = self.config, self.redis_url, self.target_hash
            self._progress.clear()
            if self.state.state != NodeStatus.WARMING:
                self.state.transition(NodeStatus.WARMING)
            self.state.progress_done = self.state.progress_total = 0
            self.state.config_hash = target
        self._publish()
        started = time.monotonic()
        results = self._run_workers(config, url)
        summary = summarize(results)
        counters = summary.counters
        with self._lock:
            s = self.state
            s.transition(summary.state, summary.reason)
            s.plans, s.kernels = summary.plans, counters.kernel_counts()
            s.compile_seconds = round(counters.compile_seconds, 3)
            s.saved_seconds = round(counters.compile_seconds_saved, 3)
            s.cache_bytes, s.counters = summary.cache_bytes, counters.to_json()
            s.warm_seconds = round(time.monotonic() - started, 3)
            s.warmed_at = time.time()
            s.store = next((r.store.reason for r in results if not r.store.ok), "ok")
            s.capture = {**s.capture, "learned": summary.learned}
            s.boot = summary.boot
            s.building = {}
            if not s.progress_total:  # warm from the caches: no worker counted its tasks
                s.progress_total = s.progress_done = sum(m.tasks for r in results
                                                         for m in r.models)
            self._schedule_retry()
        self.metrics.observe_warmup(self.state)
        if self.state.state in WARM_STATES:
            self._start_capture(summary.capture, url)
        self.log.info("warmup finished", extra={
            "state": self.state.state, "reason": self.state.reason,
            "kernels": self.state.kernels, "seconds": self.state.warm_seconds})

    def _run_workers(self, config: WarmdConfig, url: str | None) -> list[NodeWarm]:
        builder = self.state.gpus <= 0
        serves = self._serves()
        # A node whose plan the caches hold is warm without GPU workers: checked here, with
        # the node's GPUs visible (Ray hides them from this num_gpus=0 actor).
        visible = {} if builder else {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(self.state.gpus)))}
        try:
            context = node_context(config, self.node_name).with_variables(visible)
            warm = warm_node(config, context, builder=builder, redis_url=url, warm_only=True,
                             peers=self.peers, serves=serves)
        except Exception:  # only a shortcut: the workers below decide
            self.log.exception("warm check failed")
            warm = NodeWarm([], warm=False)
        if warm.warm:
            return [warm]
        shards = 1 if builder else self.state.gpus
        me = ray_api.current_actor()
        calls = [(config.public_json(), builder, i, shards, url, self.node_name, me, serves)
                 for i in range(shards)]

        def tick() -> bool:
            self._publish()
            return self._stop.is_set()

        outcomes = ray_api.run_pinned(warm_shard, self.node_id, calls, 0 if builder else 1,
                                      f"warmd-warm-{self.node_id[:8]}",
                                      config.agent.heartbeat_seconds, tick)
        return [NodeWarm.from_json(outcome) if not isinstance(outcome, Exception)
                else _worker_failed(i, outcome) for i, outcome in enumerate(outcomes)]

    def _serves(self) -> bool:
        """Whether this node serves (warmd.cluster.work.node_serves), on the cluster as it
        is now; said in the node's record."""
        try:
            cluster_gpus = sum(n.gpus for n in ray_api.list_nodes() if n.alive)
        except Exception:  # Ray's view is only needed by a builder; unknown: it does not
            self.log.exception("listing the cluster's nodes failed")
            cluster_gpus = 1
        serves = node_serves(self.state.gpus, cluster_gpus)
        with self._lock:
            self.state.serves = serves
        return serves

    # --- capture: entries compiled after READY (warmd.capture) ----------------------------

    def _start_capture(self, scopes: list[CaptureScope], url: str | None) -> None:
        """Start watching (and, on a trusted producer, re-deriving) in threads of their
        own: nothing here reads a cache, so nothing a cache holds can stop this thread's
        heartbeats."""
        from warmd.capture.watch import Capture, CaptureTrust

        context = node_context(self.config, self.node_name)
        trust = CaptureTrust(self.config.capture.trust)

        def open_shared(target):
            from warmd.store import open_shared_cache

            if settings.store_is_off(url):
                return None
            return open_shared_cache(url, context, target=target, node=self.node_name)

        try:
            capture = Capture(self.node_name, scopes, open_shared,
                              on_runtime_jit=self._runtime_jit, on_count=self._capture_count,
                              trust=trust, on_started=self._note_capture)
            capture.start()
        except Exception:  # the node is warm either way; say why nothing is watched
            self.log.exception("capture did not start")
            return
        self.capture = capture
        self._note_capture()
        if trust is CaptureTrust.REDERIVE and self.node_name in \
                self.config.capture.rederive_nodes:
            self._start_rederiver(scopes, open_shared, context)

    def _start_rederiver(self, scopes, open_shared, context: NodeContext) -> None:
        from warmd.rederive import Rederiver

        try:
            rederiver = Rederiver(scopes, open_shared, context, on_count=self._capture_count,
                                  on_result=self._rederived)
            rederiver.start()
        except Exception:
            self.log.exception("re-derivation did not start")
            return
        self.rederiver = rederiver
        self.log.info("re-deriving captured entries (a trusted producer)")

    def _rederived(self, result) -> None:
        """Each claim's outcome in the node's log (the counters are in its record)."""
        self.log.info("re-derivation: %s %s %s", result.outcome, result.library, result.name,
                      extra={"identical": result.identical, "why": result.why[:300]})

    def _stop_capture(self) -> None:
        capture, self.capture = self.capture, None
        rederiver, self.rederiver = self.rederiver, None
        if rederiver is not None:
            rederiver.stop()
        if capture is not None:
            capture.stop()
            self._note_capture()

    def _runtime_jit(self, event) -> None:
        with self._lock:
            self.state.runtime_jit_events = [*self.state.runtime_jit_events,
                                             event.to_json()][-MAX_EVENTS:]

    def _capture_count(self, counter: str, library: str, amount: int) -> None:
        """A capture counter grew: into the record (published now, not at the next
        heartbeat: a canary asks within seconds) and Prometheus."""
        with self._lock:
            s = self.state
            counts = s.runtime_jit if counter == "runtime_jit" else \
                s.capture.setdefault(counter, {})
            counts[library] = counts.get(library, 0) + amount
        self.metrics.count_capture(counter, library, amount)
        self._publish()

    def _note_capture(self) -> None:
        with self._lock:
            self.state.capture["mode"] = self.capture.mode if self.capture else "stopped"
        self._publish()

    def _finish_failed(self, reason: str) -> None:
        with self._lock:
            if self.state.state != NodeStatus.WARMING:
                self.state.transition(NodeStatus.WARMING)
            self.state.transition(NodeStatus.FAILED, reason)
            self._schedule_retry()

    def _publish(self) -> None:
        with self._lock:
            self.state.heartbeat = time.time()
            snapshot = NodeState.from_json(self.state.to_json())
        self.metrics.observe_state(snapshot)
        self.store.put(snapshot)


def _worker_failed(shard: int, exc: Exception) -> NodeWarm:
    reason = f"warm worker {shard} failed: {type(exc).__name__}: {exc}"
    return NodeWarm([ModelResult(f"worker {shard}", ok=False, reason=reason[:500])])
