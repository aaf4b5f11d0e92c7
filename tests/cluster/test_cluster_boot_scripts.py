"""The cluster-boot benchmarks' own logic, on synthetic data (the device runs the rest):
argument handling, the compile-count and timing arithmetic, and the builder comparison."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))

import bench_cluster_boot as bench  # noqa: E402
import cluster_boot_checks as checks  # noqa: E402
import device_cluster_boot as device  # noqa: E402


def _node(compiled: int, nvcc: int, held: int, rc=0, nvcc_seconds=40.0, discovery=9.0):
    return {"rc": rc, "compiled": compiled, "nvcc_runs": nvcc, "held": held,
            "nvcc_seconds": nvcc_seconds, "discovery_seconds": discovery}


def test_device_arguments_are_checked():
    assert device.parse_nodes("4, 2,4") == [2, 4]
    for bad in ("1", "x", "", "2,-3"):
        with pytest.raises(ValueError):
            device.parse_nodes(bad)
    assert device.parse_models("dsv3,qwen") == ["dsv3", "qwen"]
    assert device.parse_models("qwen235") == ["qwen235"]
    with pytest.raises(ValueError, match="qwen, dsv3, qwen235"):
        device.parse_models("llama")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "device_cluster_boot.py"),
                           "run", "--out", "/tmp/unused", "--nodes", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("device_cluster_boot: --nodes takes counts of 2 or more, "
                                   "got '1'")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "device_cluster_boot.py"),
                           "run", "--out", "/tmp/unused", "--nodes", "2,4096", "--pinned"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().startswith(
        "device_cluster_boot: --pinned: 4096 nodes need at least 4096 cores, have ")


def test_summed_compiles_against_distinct_entries_and_the_time_goal():
    run = {"wall": 30.0, "distinct_entries": 58,
           "nodes": [_node(30, 30, 58, nvcc_seconds=120.0), _node(28, 28, 58)]}
    judged = device.judge_run(run, alone_wall=27.0, cores=16)
    assert judged["checks"] == {"all_ok": True, "compiles_equal_distinct": True,
                                "nvcc_runs_equal_distinct": True,
                                "every_node_holds_every_entry": True, "within_goal": True}
    assert judged["ratio_to_alone"] == round(30 / 27, 3)
    assert judged["projected_k_machines"] == 9.0 + 120.0 / 16
    twice = {"wall": 44.0, "distinct_entries": 55,
             "nodes": [_node(55, 55, 55), _node(55, 55, 55)]}  # issue 21's "before"
    judged = device.judge_run(twice, alone_wall=27.0, cores=16)
    assert not judged["checks"]["compiles_equal_distinct"]
    assert not judged["checks"]["within_goal"] and judged["ratio_to_alone"] == 1.63
    short = {"wall": 20.0, "distinct_entries": 10, "nodes": [_node(10, 10, 9, rc=1)]}
    judged = device.judge_run(short, None, 16)
    assert not judged["checks"]["all_ok"] and not judged["checks"]["every_node_holds_every_entry"]
    assert "within_goal" not in judged["checks"]


def _pinned_node(ready: float, cores=4, jobs=4):
    return {**_node(10, 10, 20), "ready": ready, "cores": cores, "jobs": jobs}


def test_pinned_nodes_take_consecutive_runs_of_cores_and_the_rest_stays_idle():
    assert device.core_slices(list(range(16)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                      [8, 9, 10, 11], [12, 13, 14, 15]]
    assert device.core_slices([2, 3, 5, 7, 11], 2) == [[2, 3], [5, 7]]
    assert device.core_slices(list(range(16)), 2)[0] == list(range(8))  # the node alone's
    with pytest.raises(ValueError, match="3 nodes need at least 3 cores, have 2"):
        device.core_slices([0, 1], 3)


def test_pinned_runs_are_judged_against_the_node_alone_over_k():
    plan = {"a", "b"}
    run = {"k": 4, "wall": 22.0, "cores_per_node": 4,
           "nodes": [_pinned_node(20.0), _pinned_node(21.0), _pinned_node(22.0),
                     _pinned_node(19.5)]}
    judged = device.judge_pinned(run, 71.0, [plan] * 4, plan)
    assert judged["ideal"] == 17.75 and judged["ratio_to_alone_over_k"] == 1.239
    assert judged["limit"] == 1.3 and judged["ready_spread"] == round(2.5 / 22, 3)
    assert judged["checks"] == {"ready_spread_within_limit": True,
                                "jobs_equal_pinned_cores": True,
                                "every_node_holds_every_plan_entry": True,
                                "alone_measured": True, "within_limit": True}
    # issue 30's first measurement: 31 s at K = 4 against 71 s alone on 4 cores
    slow = {**run, "wall": 31.0, "nodes": [_pinned_node(31.0), _pinned_node(24.0, jobs=16),
                                           _pinned_node(30.0, cores=16), _pinned_node(29.0)]}
    judged = device.judge_pinned(slow, 71.0, [plan, plan, {"a"}, plan], plan)
    assert judged["ratio_to_alone_over_k"] == 1.746 and judged["ready_spread"] == 0.226
    assert {name for name, ok in judged["checks"].items() if not ok} == {
        "ready_spread_within_limit", "jobs_equal_pinned_cores",
        "every_node_holds_every_plan_entry", "within_limit"}
    pair = {"k": 2, "wall": 21.5, "cores_per_node": 8,
            "nodes": [_pinned_node(21.5, 8, 8), _pinned_node(21.0, 8, 8)]}
    assert device.judge_pinned(pair, 38.0, [plan] * 2, plan)["checks"]["within_limit"]
    judged = device.judge_pinned(pair, 36.0, [plan] * 2, plan)
    assert judged["ratio_to_alone_over_k"] == 1.194 and not judged["checks"]["within_limit"]
    three = {**pair, "k": 3, "nodes": pair["nodes"] + [_pinned_node(21.5, 8, 8)]}
    judged = device.judge_pinned(three, 60.0, [plan] * 3, plan)
    assert judged["limit"] is None and "within_limit" not in judged["checks"]
    judged = device.judge_pinned(pair, None, [plan] * 2, set())
    assert not judged["checks"]["alone_measured"] and "ratio_to_alone_over_k" not in judged
    assert not judged["checks"]["every_node_holds_every_plan_entry"]


def test_a_loaded_baseline_is_the_mean_ready_of_k_nodes_alone_at_once():
    # 26.5 s at K = 4 against four nodes alone at once that were ready at 80-86 s
    judged = device.loaded_ratio(26.5, [80.0, 82.0, 84.0, 86.0], 4)
    assert judged == {"loaded_alone": 83.0, "ratio_to_loaded_alone_over_k": 1.277}
    assert device.loaded_ratio(20.0, [30.0, 34.0], 2)["ratio_to_loaded_alone_over_k"] == 1.25
    proc = subprocess.run([sys.executable, str(SCRIPTS / "device_cluster_boot.py"),
                           "run", "--out", "/tmp/unused", "--loaded"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "device_cluster_boot: --loaded goes with --pinned"


def test_a_pinned_run_starts_only_with_its_expected_time_left():
    assert checks.ready_spread([10.0], 10.0) == 0.0
    assert checks.ready_spread([8.0, 10.0], 10.0) == 0.2
    # the node alone from its cores, K nodes from the node alone measured
    assert device.pinned_need(1, 8, None) == round(300 / 8 * 1.3 + 10, 1)
    assert device.pinned_need(1, 4, None) == 107.5
    assert device.pinned_need(2, 8, 38.0) == 53.0
    assert device.pinned_need(4, 4, 71.0) == 50.5


def test_builder_entries_are_compared_by_name_and_bytes(tmp_path):
    gpu = tmp_path / "gpu" / "cache"
    for name, cubin in (("a.00", b"\x7fELF1"), ("b.00", b"\x7fELF2")):
        (gpu / name).mkdir(parents=True)
        (gpu / name / "kernel.cu").write_text("src")
        (gpu / name / "kernel.cubin").write_bytes(cubin)
    same = {"a.00": {"kernel.cu": b"src", "kernel.cubin": b"\x7fELF1"}}
    assert device.builder_compare(tmp_path / "gpu", same)["identical"]
    other = {"a.00": {"kernel.cu": b"src", "kernel.cubin": b"\x7fELFX"},
             "c.00": {"kernel.cu": b"x"}}
    row = device.builder_compare(tmp_path / "gpu", other)
    assert not row["identical"] and row["missing_on_gpu_node"] == ["c.00"]
    assert row["differ"] == [{"entry": "a.00", "files": ["kernel.cubin"]}]
    assert not device.builder_compare(tmp_path / "gpu", {})["identical"]


def test_cpu_bench_judges_against_one_node_divided_by_k():
    results = [{"k": 1, "wall": 100.0, "summed_compiles": 60, "distinct_kernels": 60,
                "compile_log": 60},
               {"k": 4, "wall": 30.0, "summed_compiles": 60, "distinct_kernels": 60,
                "compile_log": 60},
               {"k": 8, "wall": 20.0, "summed_compiles": 61, "distinct_kernels": 60,
                "compile_log": 61}]
    failures = bench.judge(results, 1.3)
    assert results[1]["ideal"] == 25.0 and results[1]["ratio"] == 1.2
    assert results[2]["ratio"] == 1.6
    assert failures == ["K=8: 61 compiles for 60 kernels", "K=8: the compile log has 61 "
                        "compiles", "K=8: 20.0 s is 1.6x of one node / K (12.5 s; at most "
                        "1.3x)"]
    assert bench.kernel_names(3, 7) == {
        "testlib/boot/00": ["kernel.boot000.00000000", "kernel.boot003.00000003",
                            "kernel.boot006.00000006"],
        "testlib/boot/01": ["kernel.boot001.00000001", "kernel.boot004.00000004"],
        "testlib/boot/02": ["kernel.boot002.00000002", "kernel.boot005.00000005"]}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_cluster_boot.py"),
                           "testlib", "--nodes", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "bench_cluster_boot: --nodes needs K >= 1"
