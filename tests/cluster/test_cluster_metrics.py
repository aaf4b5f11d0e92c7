"""The daemon's metrics without a Ray cluster: every metric in the docs' table, every series
at zero before the first event, the controller's endpoint counting nodes by state and the
boot's progress, the node's endpoint, help texts that are sentences."""

from __future__ import annotations

import platform
import re
import urllib.request

import pytest

from warmd.cluster import state as st
from warmd.cluster.state import NodeState


def test_every_metric_is_in_the_docs_table():
    pytest.importorskip("prometheus_client")
    from pathlib import Path

    from warmd.cluster.metrics import AgentMetrics

    docs = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text()
    table = docs.split("## Metrics and logs", 1)[1].split("\n\n", 3)[2]
    documented = set(re.findall(r"`(warmd_[a-z_]+)`", table))
    names = {f"{m.name}_total" if m.type == "counter" else
             f"{m.name}_info" if m.type == "info" else m.name
             for m in AgentMetrics("n").registry.collect() if m.name.startswith("warmd_")}
    assert documented == names
    controller = docs.split("The controller serves", 1)[1].split("\n\n", 2)[1]
    assert set(re.findall(r"`(warmd_[a-z_]+)`", controller)) == _controller_metric_names()


def _controller_metric_names() -> set[str]:
    from warmd.cluster.metrics import ControllerMetrics

    counters = {"reconciles": 1, "agents_started": 1, "agents_replaced": 0,
                "nodes_removed": 0, "errors": 0}
    metrics = ControllerMetrics(lambda: [], lambda: counters)
    return {f"{m.name}_total" if m.type == "counter" else
            f"{m.name}_info" if m.type == "info" else m.name
            for m in metrics.registry.collect() if m.name.startswith("warmd_")}


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_every_series_exists_at_zero_before_the_first_event_with_build_and_process_info():
    pytest.importorskip("prometheus_client")
    from warmd import __version__
    from warmd.cluster.metrics import AgentMetrics
    from warmd.libraries import LIBRARIES

    metrics = AgentMetrics("gpu-a-1f2e3d4c")
    port = metrics.serve(0)
    try:
        text = _scrape(port)
    finally:
        metrics.close()
    node = 'node="gpu-a-1f2e3d4c"'
    for library in ("deep_gemm", "flashinfer", "triton"):
        assert library in LIBRARIES
        assert f'warmd_runtime_jit_total{{library="{library}",{node}}} 0.0' in text
        assert f'warmd_captured_total{{library="{library}",{node}}} 0.0' in text
    for outcome in ("local_hit", "remote_hit", "compiled", "failed"):
        assert f'warmd_kernels_total{{{node},outcome="{outcome}"}} 0.0' in text
    assert f"warmd_compile_seconds_total{{{node}}} 0.0" in text
    assert f"warmd_warmup_seconds_count{{{node}}} 0.0" in text
    assert (f'warmd_build_info{{component="agent",{node},python="{platform.python_version()}",'
            f'version="{__version__}"}} 1.0') in text
    assert "process_resident_memory_bytes " in text and "process_cpu_seconds_total " in text


def test_controller_endpoint_counts_nodes_by_state_and_the_boot_progress():
    pytest.importorskip("prometheus_client")
    from warmd.cluster.metrics import ControllerMetrics

    records = [NodeState("a" * 56, state=st.READY, progress_done=4, progress_total=4),
               NodeState("b" * 56, state=st.WARMING, progress_done=1, progress_total=4),
               NodeState("c" * 56, state=st.WARMING, progress_done=0, progress_total=2),
               NodeState("d" * 56, state=st.DEGRADED, progress_done=2, progress_total=2)]
    current = [r.to_json() for r in records]
    metrics = ControllerMetrics(lambda: current, lambda: {"reconciles": 7, "errors": 0})
    port = metrics.serve(0, "127.0.0.1")
    try:
        assert metrics.endpoint_url("10.0.0.7") == f"http://127.0.0.1:{port}/metrics"
        text = _scrape(port)
        current[1] = NodeState("b" * 56, state=st.READY, progress_done=4,
                               progress_total=4).to_json()
        later = _scrape(port)  # read at each scrape
    finally:
        metrics.close()
    assert 'warmd_cluster_nodes{state="WARMING"} 2.0' in text
    assert 'warmd_cluster_nodes{state="READY"} 1.0' in text
    assert 'warmd_cluster_nodes{state="FAILED"} 0.0' in text  # every state, zeros too
    assert "warmd_cluster_warm_ratio 0.5" in text
    assert 'warmd_cluster_progress_tasks{kind="done"} 7.0' in text
    assert 'warmd_cluster_progress_tasks{kind="total"} 12.0' in text
    assert "warmd_controller_reconciles_total 7.0" in text
    assert 'component="controller"' in text and "process_start_time_seconds " in text
    assert 'warmd_cluster_nodes{state="READY"} 2.0' in later
    assert "warmd_cluster_warm_ratio 0.75" in later


def test_metrics_endpoint(tmp_path):
    pytest.importorskip("prometheus_client")
    from warmd.cluster.metrics import AgentMetrics, metric_name
    from warmd.stats import CounterFlag, select

    metrics = AgentMetrics("gpu-a-1f2e3d4c")
    port = metrics.serve(0)
    busy = AgentMetrics("gpu-b-5a6b7c8d")
    try:
        assert busy.serve(port) != port  # a taken port falls back to a free one
        counters = {"local_hits": 1, "remote_hits": 1, "compiled": 1, "failed": 0,
                    "compile_seconds": 6.0, "compile_seconds_saved": 2.5,
                    "bytes_fetched": 2048, "tasks": 2}
        node = NodeState("0a" * 28, state=st.READY, warm_seconds=7.5, compile_seconds=6.0,
                         name="gpu-a-1f2e3d4c", cache_bytes={"flashinfer": 4096},
                         counters=counters, kernels={"total": 3, "local_hits": 1,
                                                     "remote_hits": 1, "compiled": 1,
                                                     "failed": 0})
        metrics.observe_warmup(node)
        metrics.count_capture("runtime_jit", "triton")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
    finally:
        metrics.close()
        busy.close()
    # labelled by the node's stable name, never by Ray's node id (new at every restart)
    assert 'warmd_node_state{node="gpu-a-1f2e3d4c",state="READY"} 1.0' in text
    assert 'warmd_node_state{node="gpu-a-1f2e3d4c",state="WARMING"} 0.0' in text
    assert "0a0a0a" not in text and "node_id" not in text
    assert 'warmd_kernels_total{node="gpu-a-1f2e3d4c",outcome="remote_hit"} 1.0' in text
    assert 'warmd_cache_bytes{library="flashinfer",node="gpu-a-1f2e3d4c"} 4096.0' in text
    assert 'warmd_warmup_seconds_sum{node="gpu-a-1f2e3d4c"} 7.5' in text
    assert 'warmd_compile_seconds_total{node="gpu-a-1f2e3d4c"} 6.0' in text
    assert 'warmd_runtime_jit_total{library="triton",node="gpu-a-1f2e3d4c"} 1.0' in text
    # Every counter of a warmup (warmd.stats.COUNTERS, CounterFlag.RUN): its metric, units last.
    assert 'warmd_compile_saved_seconds_total{node="gpu-a-1f2e3d4c"} 2.5' in text
    assert 'warmd_fetched_bytes_total{node="gpu-a-1f2e3d4c"} 2048.0' in text
    assert 'warmd_tasks_total{node="gpu-a-1f2e3d4c"} 2.0' in text
    for stat in select(CounterFlag.RUN, without=CounterFlag.KERNEL):
        name, unit = metric_name(stat)
        assert f"{name}{'_' + unit if unit else ''}_total{{" in text
    assert "_created" not in text  # no start-time series beside each counter and histogram


def test_metric_help_texts_are_sentences():
    """Each HELP says what is counted in words (not a table label like "failed")."""
    pytest.importorskip("prometheus_client")
    from warmd.cluster.metrics import AgentMetrics
    from warmd.stats import HELP, CounterFlag, ids

    exported = (set(ids(CounterFlag.RUN, without=CounterFlag.KERNEL))
                | set(ids(CounterFlag.CAPTURE)))
    assert set(HELP) == exported
    for metric in AgentMetrics("n").registry.collect():
        words = metric.documentation.split()
        assert len(words) >= 4 and metric.documentation[0].isupper(), metric.name
        assert "(warmups)" not in metric.documentation, metric.name
