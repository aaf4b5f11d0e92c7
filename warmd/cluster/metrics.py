"""Each agent's Prometheus endpoint: warmup seconds, the last warmups' counters, cache bytes,
state.

The counters' metrics are derived from warmd.stats.COUNTERS (what a warmup counts,
CounterFlag.RUN): kernel outcomes (KERNEL) are one `warmd_kernels_total` by `outcome`, and
every other counter is its own Prometheus counter, named after its id with its unit last, as
Prometheus names units: TIME in `_seconds` (compile_seconds_saved:
`warmd_compile_saved_seconds_total`), BYTES in `_bytes` (bytes_fetched:
`warmd_fetched_bytes_total`); their HELP texts are warmd.stats.HELP's.

Every series is labelled `node`: the node's stable name (WARMD_NODE_NAME, else the node-id
file; what `warmd status` shows), not Ray's node id, which changes at every restart and
would start new series each time. No `_created` series: a counter's start time says nothing
an operator needs (the heartbeat gauge says the agent is alive).
"""

from __future__ import annotations

import contextlib
import errno

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from warmd.cluster.state import NodeState, NodeStatus
from warmd.stats import CounterFlag, Stat, help_text, select

# Node counters -> the `outcome` label (the executors' own outcome names).
OUTCOMES = {s.id: s.outcome for s in select(CounterFlag.KERNEL)}
_UNITS = {CounterFlag.TIME: "seconds", CounterFlag.BYTES: "bytes"}


def metric_name(stat: Stat) -> tuple[str, str]:
    """(name, unit) of the Prometheus counter of a warmup counter that is not a kernel
    outcome; prometheus_client appends the unit, then `_total`."""
    unit = next((u for flag, u in _UNITS.items() if stat.has(flag)), "")
    words = [w for w in stat.id.split("_") if w != unit]
    return "warmd_" + "_".join(words), unit


class AgentMetrics:
    """A private registry per agent (one process may hold several in tests), its series
    labelled with the node's name."""

    def __init__(self, node_name: str) -> None:
        disable_created_metrics()  # process-wide in prometheus_client: only warmd's here
        self.registry = CollectorRegistry()
        self.node = node_name
        r = self.registry
        self.state = Gauge("warmd_node_state",
                           "Whether the node is in this state (1) or not (0)",
                           ["node", "state"], registry=r)
        self.warmup_seconds = Histogram(
            "warmd_warmup_seconds", "Duration of each complete warmup of the node", ["node"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600), registry=r)
        self.kernels = Counter("warmd_kernels", "Kernels the node's warmups handled, by outcome",
                               ["node", "outcome"], registry=r)
        self.counters = {stat.id: _counter(stat, r)
                         for stat in select(CounterFlag.RUN, without=CounterFlag.KERNEL)}
        self.cache_bytes = Gauge("warmd_cache_bytes", "Bytes in the node's kernel caches",
                                 ["node", "library"], registry=r)
        self.progress = Gauge("warmd_progress_tasks",
                              "Tasks of the current warmup: done so far, and in total",
                              ["node", "kind"], registry=r)
        self.store_ok = Gauge(
            "warmd_shared_cache_up",
            "Whether the node's last warmup reached the shared cache (1) or not (0)", ["node"],
            registry=r)
        self.heartbeat = Gauge("warmd_agent_heartbeat_timestamp_seconds",
                               "Unix time of the node agent's last heartbeat", ["node"],
                               registry=r)
        # the capture's counters (CounterFlag.CAPTURE): warmd_runtime_jit_total...
        self.capture = {stat.id: Counter(f"warmd_{stat.id}", help_text(stat),
                                         ["node", "library"], registry=r)
                        for stat in select(CounterFlag.CAPTURE)}
        self._server = None

    def observe_state(self, node: NodeState) -> None:
        name = self.node
        for state in NodeStatus:
            self.state.labels(name, state).set(1 if node.state == state else 0)
        self.progress.labels(name, "done").set(node.progress_done)
        self.progress.labels(name, "total").set(node.progress_total)
        self.heartbeat.labels(name).set(node.heartbeat)
        for library, size in node.cache_bytes.items():
            self.cache_bytes.labels(name, library).set(size)

    def observe_warmup(self, node: NodeState) -> None:
        """Once per finished warmup: its duration, outcomes and compile time."""
        name = self.node
        self.warmup_seconds.labels(name).observe(node.warm_seconds)
        for counter, outcome in OUTCOMES.items():
            self.kernels.labels(name, outcome).inc(node.counters.get(counter, 0))
        for counter, metric in self.counters.items():
            metric.labels(name).inc(node.counters.get(counter, 0))
        self.store_ok.labels(name).set(1 if node.store == "ok" else 0)
        self.observe_state(node)

    def count_capture(self, counter: str, library: str, amount: int = 1) -> None:
        self.capture[counter].labels(self.node, library).inc(amount)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint on host (loopback unless the config names an address: it
        has no authentication); a taken port falls back to any free one. Returns the port."""
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            self._server, _ = start_http_server(0, addr=host, registry=self.registry)
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
            self._server = None


def _counter(stat: Stat, registry: CollectorRegistry) -> Counter:
    name, unit = metric_name(stat)
    return Counter(name, help_text(stat), ["node"], unit=unit, registry=registry)
