"""Per-node state machine and where it is kept: the agent's memory (served to the controller
over Ray) and Redis (for any process, Ray or not).

    PENDING ──> WARMING ──> READY | DEGRADED | FAILED ──(config changed, agent restarted)──┐
                   ^────────────────────────────────────────────────────────────────────┘

READY: every task of every model is warm and the shared cache worked. DEGRADED: every task is
warm, but the shared cache was unreachable or refused work (the reason says which), so some
kernels were compiled locally that the cluster may already have had. FAILED: a model could not
be planned on this node (its path is missing here, say) or a task failed; the reason says which.

Redis keys (all under the store's versioned prefix, per warmd namespace):
    warmd:v1:nodes:<ns>:<node id>   JSON node record, expires unless refreshed by heartbeats
    warmd:v1:nodes:<ns>             SET of node ids with a record
    warmd:v1:daemon:<ns>            JSON: the running controller's config summary
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields

from warmd.store.layout import PREFIX

log = logging.getLogger("warmd.cluster")

PENDING, WARMING, READY, DEGRADED, FAILED = "PENDING", "WARMING", "READY", "DEGRADED", "FAILED"
STATES = (PENDING, WARMING, READY, DEGRADED, FAILED)
WARM_STATES = frozenset({READY, DEGRADED})
_NEXT = {
    PENDING: {WARMING, FAILED},
    WARMING: {READY, DEGRADED, FAILED},
    READY: {WARMING},
    DEGRADED: {WARMING},
    FAILED: {WARMING},
}
KERNEL_COUNTS = ("total", "local_hits", "remote_hits", "compiled", "failed")


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
    state: str = PENDING
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

    def transition(self, new: str, reason: str = "") -> None:
        if new not in _NEXT.get(self.state, set()):
            raise BadTransition(f"node {self.node_id[:8]}: {self.state} -> {new}")
        self.state, self.reason, self.changed_at = new, reason, time.time()

    @property
    def hit_rate(self) -> float:
        total = self.kernels.get("total", 0)
        hits = self.kernels.get("local_hits", 0) + self.kernels.get("remote_hits", 0)
        return hits / total if total else 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["hit_rate"] = round(self.hit_rate, 4)
        return data

    @classmethod
    def from_json(cls, data: dict) -> NodeState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def nodes_key(namespace: str) -> str:
    return f"{PREFIX}nodes:{namespace}"


def node_key(namespace: str, node_id: str) -> str:
    return f"{PREFIX}nodes:{namespace}:{node_id}"


def daemon_key(namespace: str) -> str:
    return f"{PREFIX}daemon:{namespace}"


class StateStore:
    """Node records in Redis through redis-py. Never raises for store trouble: a failed
    write returns False and is counted, a failed read returns nothing, both say why."""

    def __init__(self, url: str | None, namespace: str, ttl: float = 120.0) -> None:
        from warmd.store import OFF

        if url and url.strip().lower() in OFF:
            url = None
        self.namespace = namespace
        self.ttl = max(int(ttl), 10)
        self.errors = 0
        self.last_error = "" if url else "no Redis configured"
        self._url = url
        self._client = None

    @property
    def url(self) -> str | None:
        return self._url

    def _conn(self):
        if self._client is None:
            from warmd.store.connection import make_client, parse_store_url

            self._client = make_client(parse_store_url(self._url))
        return self._client

    def _call(self, what: str, fn, default=None):
        if not self._url:
            return default
        from warmd.store.connection import STORE_ERRORS, redact, scrub

        try:
            result = fn(self._conn())
        except STORE_ERRORS as exc:
            self.errors += 1
            self.last_error = scrub(f"{type(exc).__name__}: {exc}", self._url)
            log.debug("state store %s failed at %s: %s", what, redact(self._url),
                      self.last_error)
            self._client = None
            return default
        self.last_error = ""
        return result

    @property
    def healthy(self) -> bool:
        return bool(self._url) and not self.last_error

    def put(self, state: NodeState) -> bool:
        body = json.dumps(state.to_json(), sort_keys=True)

        def write(c) -> bool:
            c.set(node_key(self.namespace, state.node_id), body, ex=self.ttl)
            c.sadd(nodes_key(self.namespace), state.node_id)
            return True

        return bool(self._call("put", write, False))

    def get_all(self) -> list[NodeState] | None:
        """Every node record; None when the store could not be read."""

        def read(c) -> list[NodeState]:
            out = []
            for raw_id in sorted(c.smembers(nodes_key(self.namespace))):
                node_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                raw = c.get(node_key(self.namespace, node_id))
                if raw is None:
                    continue
                with contextlib.suppress(ValueError, TypeError):
                    out.append(NodeState.from_json(json.loads(raw)))
            return out

        return self._call("get_all", read, None)

    def delete(self, node_id: str) -> bool:
        def drop(c) -> bool:
            c.delete(node_key(self.namespace, node_id))
            c.srem(nodes_key(self.namespace), node_id)
            return True

        return bool(self._call("delete", drop, False))

    def put_daemon(self, info: dict) -> bool:
        body = json.dumps(info, sort_keys=True)
        return bool(self._call("put_daemon",
                               lambda c: c.set(daemon_key(self.namespace), body), False))

    def get_daemon(self) -> dict | None:
        raw = self._call("get_daemon", lambda c: c.get(daemon_key(self.namespace)), None)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def delete_daemon(self) -> bool:
        return bool(self._call("delete_daemon",
                               lambda c: c.delete(daemon_key(self.namespace)), False))

    def ping(self) -> bool:
        return bool(self._call("ping", lambda c: c.ping(), False))

    def server_size(self) -> dict | None:
        """Memory and key count of the Redis server (None when unreachable)."""

        def measure(c) -> dict:
            memory = c.info("memory")
            return {"used_memory": int(memory.get("used_memory", 0)), "keys": int(c.dbsize())}

        try:
            return self._call("server_size", measure, None)
        except (AttributeError, TypeError, ValueError):  # a Redis Cluster answers per node
            return None

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
