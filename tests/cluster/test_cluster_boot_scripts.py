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
    with pytest.raises(ValueError, match="qwen, dsv3"):
        device.parse_models("llama")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "device_cluster_boot.py"),
                           "run", "--out", "/tmp/unused", "--nodes", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("device_cluster_boot: --nodes takes counts of 2 or more, "
                                   "got '1'")


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
