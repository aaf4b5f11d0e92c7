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
an operator needs (the heartbeat gauge says the agent is alive). Every series of a counter
exists from the start at zero (per outcome, per library for the capture's), so that a rate or
an alert on it works before the first event. Both endpoints carry `warmd_build_info` and the
process collector's `process_*` series.

The controller's endpoint (ControllerMetrics) holds the cluster's gauges: nodes by state and
the boot's progress, read from the controller's node records at each scrape.
"""

from __future__ import annotations

import contextlib
import errno
import platform
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from warmd import __version__
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
        self._zero_series()
        process_metrics(r, "agent", {"node": node_name})

    def _zero_series(self) -> None:
        """Every counter's series at zero from the start (per outcome; per library for the
        capture's), so that a rate or an alert works before the first event."""
        from warmd.libraries import LIBRARIES

        name = self.node
        self.warmup_seconds.labels(name)
        for outcome in OUTCOMES.values():
            self.kernels.labels(name, outcome)
        for metric in self.counters.values():
            metric.labels(name)
        for metric in self.capture.values():
            for library in LIBRARIES:
                metric.labels(name, library)

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

    def endpoint_url(self, node_ip: str) -> str:
        """The served endpoint's URL: the address it is bound to, or the node's IP where it
        listens on every address."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        if host in ("", "0.0.0.0", "::"):
            host = node_ip or "127.0.0.1"
        return f"http://{host}:{port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
            self._server = None


def process_metrics(registry: CollectorRegistry, component: str,
                    labels: dict[str, str]) -> None:
    """`warmd_build_info` (warmd's version, this component, Python's version) and the
    process collector's `process_*` series (CPU, memory, open files, start time)."""
    info = Info("warmd_build", "The warmd version, the component serving it and its Python",
                list(labels), registry=registry)
    (info.labels(**labels) if labels else info).info(
        {"version": __version__, "component": component,
         "python": platform.python_version()})
    ProcessCollector(registry=registry)


class ControllerMetrics:
    """The controller's endpoint: the cluster's gauges, computed at each scrape from the
    node records `records()` returns (NodeState JSON, as the controller keeps them) and its
    counters `counters()` returns (reconciles, agents started and replaced, nodes removed,
    errors)."""

    def __init__(self, records: Callable[[], list[dict]],
                 counters: Callable[[], dict[str, int]]) -> None:
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.registry.register(_ClusterCollector(records, counters))
        process_metrics(self.registry, "controller", {})
        self._server = None

    serve = AgentMetrics.serve  # the one endpoint logic (bind, a taken port's fallback)
    endpoint_url = AgentMetrics.endpoint_url
    close = AgentMetrics.close


class _ClusterCollector(Collector):
    def __init__(self, records: Callable[[], list[dict]],
                 counters: Callable[[], dict[str, int]]) -> None:
        self.records, self.counters = records, counters

    def collect(self) -> Iterator:
        nodes = [NodeState.from_json(r) for r in self.records()]
        by_state = GaugeMetricFamily("warmd_cluster_nodes",
                                     "Nodes the config selects, by their state", labels=["state"])
        for state in NodeStatus:
            by_state.add_metric([state.value], sum(n.state == state for n in nodes))
        yield by_state
        warm = GaugeMetricFamily(
            "warmd_cluster_warm_ratio", "Share of the selected nodes warm (READY or DEGRADED); "
            "1 when none is selected")
        ready = sum(n.state in (NodeStatus.READY, NodeStatus.DEGRADED) for n in nodes)
        warm.add_metric([], ready / len(nodes) if nodes else 1.0)
        yield warm
        progress = GaugeMetricFamily(
            "warmd_cluster_progress_tasks",
            "Tasks of the nodes' current or last warmups: done so far, and in total",
            labels=["kind"])
        progress.add_metric(["done"], sum(n.progress_done for n in nodes))
        progress.add_metric(["total"], sum(n.progress_total for n in nodes))
        yield progress
        for key, value in sorted(self.counters().items()):
            counter = CounterMetricFamily(f"warmd_controller_{key}",
                                          _CONTROLLER_HELP.get(key, f"Controller {key}"))
            counter.add_metric([], value)
            yield counter


_CONTROLLER_HELP = {
    "reconciles": "Reconcile rounds the controller ran",
    "agents_started": "Node agents the controller started",
    "agents_replaced": "Node agents found dead and started again",
    "nodes_removed": "Nodes forgotten after they left the cluster or the selection",
    "errors": "Reconcile rounds that failed (each logged; the next round runs)",
}


def _counter(stat: Stat, registry: CollectorRegistry) -> Counter:
    name, unit = metric_name(stat)
    return Counter(name, help_text(stat), ["node"], unit=unit, registry=registry)
