"""The warm path (issue 12): a node whose plan is in the store, or on its disk with its
records, finishes without starting a worker process and without importing torch or any
JIT library; --verify-load replays through the library; a damaged entry is not a hit.

Real parts: a redis-server, a FlashInfer module built here by a first (cold) warmup and
published by it, and the real H200 DeepGEMM entries of tests/data published the way a
cold GPU node's warmup publishes them. Node B's warmups are `warmd warmup` processes run
through scripts/bench/speed_bench.py's probe, which records what the process imported."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import hardware
import pytest

from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.plan import PlanRequest, make_plan
from warmd.warmup import WarmupOptions, run_warmup

pytestmark = pytest.mark.slow  # a real FlashInfer build and a real Redis server

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data" / "deep_gemm" / "cache"
PLAN_ARGS = ["-m", "qwen3-30b-a3b-fp8", "-t", "h200", "--engine", "sglang", "--with",
             "flashinfer", "--with", "deep_gemm", "--without", "sgl_kernel"]


def _plan():
    return make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200", engine="sglang",
                                 with_libs=("flashinfer", "deep_gemm"),
                                 without_libs=("sgl_kernel",)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A store holding the plan's silu_and_mul module (built and published by node A's
    cold warmup) and a dense DeepGEMM task's entries (published as node A's GPU warmup
    publishes them)."""
    from warmd.store import open_shared_cache, start_server

    base = tmp_path_factory.mktemp("warm-path")
    plan = _plan()
    fi_key = next(t.key for t in plan.tasks if t.module == "silu_and_mul")
    dg_key = next(t.key for t in plan.tasks if t.library == "deep_gemm"
                  and t.kernel == "fp8_gemm_nt")
    server = start_server(base / "redis", appendonly=False)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("WARMD_STATE_DIR", str(base / "state-a"))
            node_a = open_shared_cache(server.url, target=plan.env.target, node="a")
            options = WarmupOptions(cache_roots={"flashinfer": base / "a" / "fi",
                                                 "deep_gemm": base / "a" / "dg"},
                                    task_filter=f"^{re.escape(fi_key)}$")
            cold = run_warmup(plan, options, shared=node_a)
            assert cold.counters.compiled == 1 and cold.reports[0].published, cold.to_json()
            shutil.copytree(DATA, base / "a" / "dg" / "cache")
            adapter = DeepGemmCacheAdapter(base / "a" / "dg")
            dense = [e for e in adapter.list_entries() if "grouped" not in e.name]
            node_a.entries.publish_task(adapter, dg_key, dense, 12.0)
            node_a.close()
        yield {"url": server.url, "base": base, "fi": fi_key, "dg": dg_key,
               "dg_entries": sorted(e.name for e in dense)}
    finally:
        server.stop()


def _node_b(cluster: dict, name: str, *args: str) -> tuple[int, dict, dict, Path]:
    """`warmd warmup` on node B (its own caches and state) in a fresh process: exit code,
    report, what the process imported, its state dir."""
    node = cluster["base"] / name
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WARMD_STATE_DIR": str(node / "state"),
           "FLASHINFER_WORKSPACE_BASE": str(node / "fi"),
           "SGLANG_DG_CACHE_DIR": str(node / "dg")}  # SGLang's own (it forces DG_JIT_CACHE_DIR)
    node.mkdir(parents=True, exist_ok=True)
    probe = node / f"probe-{uuid.uuid4().hex[:8]}.json"
    script = ROOT / "scripts" / "bench" / "speed_bench.py"
    proc = subprocess.run([sys.executable, str(script), "probe", str(probe), "--", "warmup",
                           *PLAN_ARGS, "--json", *args],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    imported = json.loads(probe.read_text())
    assert imported["rc"] == proc.returncode
    return proc.returncode, json.loads(proc.stdout), imported["imported"], node / "state"


def _both(cluster: dict) -> list[str]:
    return ["--task-filter", f"^({re.escape(cluster['fi'])}|{re.escape(cluster['dg'])})$"]


def test_warm_node_needs_no_worker_no_torch_and_no_library(cluster):
    rc, report, imported, state = _node_b(cluster, "b", *_both(cluster),
                                          "--redis", cluster["url"])
    assert rc == 0, report
    hits = 1 + len(cluster["dg_entries"])
    assert report["kernels"] == {"total": hits, "local_hits": 0, "remote_hits": hits,
                                 "compiled": 0, "failed": 0}
    assert report["hits_by_mode"] == {"verified": hits, "library": 0}
    assert report["workers_started"] == 0 and not (state / "logs").exists()
    assert imported == {"torch": False, "deep_gemm": False, "flashinfer": False,
                        "tvm_ffi": False}
    assert {d["mode"] for d in report["task_details"]} == {"verified"}
    dg = next(d for d in report["task_details"] if d["library"] == "deep_gemm")
    assert sorted(k["name"] for k in dg["kernels"]) == cluster["dg_entries"]
    assert sorted(dg["fetched"]) == cluster["dg_entries"]
    # What the hits saved is what the installed manifests recorded, in the report as in the
    # store's own count, and it is kept in the node's records for its later local hits.
    saved = report["store"]["counters"]["compile_seconds_saved"]
    assert saved > 12.0 and report["compile_seconds_saved"] == pytest.approx(saved, abs=2e-3)

    # The same node again without the store: its records and digests verify the entries.
    rc, report, imported, state = _node_b(cluster, "b", *_both(cluster), "--no-shared")
    assert rc == 0, report
    assert report["kernels"]["local_hits"] == hits and report["kernels"]["compiled"] == 0
    assert report["compile_seconds_saved"] == pytest.approx(saved, abs=2e-3)
    assert report["hits_by_mode"] == {"verified": hits, "library": 0}
    assert report["workers_started"] == 0 and not any(imported.values())


def test_verify_load_replays_through_the_library(cluster):
    only_fi = ["--task-filter", f"^{re.escape(cluster['fi'])}$"]
    rc, report, _imported, state = _node_b(cluster, "c", *only_fi, "--redis", cluster["url"])
    assert rc == 0 and report["hits_by_mode"] == {"verified": 1, "library": 0}, report
    rc, report, imported, state = _node_b(cluster, "c", *only_fi, "--no-shared",
                                          "--verify-load")
    assert rc == 0, report
    assert report["kernels"]["local_hits"] == 1 and report["kernels"]["compiled"] == 0
    assert report["hits_by_mode"] == {"verified": 0, "library": 1}
    assert report["task_details"][0]["mode"] == "library"
    assert report["workers_started"] == 1
    assert not imported["flashinfer"]  # the worker process loaded it, not this one


@pytest.mark.skipif(hardware.deep_gemm_runs(), reason="here DeepGEMM would recompile it")
def test_a_damaged_entry_is_not_a_hit(cluster):
    rc, report, _imported, _state = _node_b(cluster, "d", *_both(cluster),
                                            "--redis", cluster["url"])
    assert rc == 0 and report["hits_by_mode"]["library"] == 0, report
    cubin = cluster["base"] / "d" / "dg" / "cache" / cluster["dg_entries"][0] / "kernel.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same mtime would not matter: bytes differ
    cubin.write_bytes(bytes(data))
    rc, report, imported, _state = _node_b(cluster, "d", *_both(cluster), "--no-shared")
    dg = next(d for d in report["task_details"] if d["library"] == "deep_gemm")
    fi = next(d for d in report["task_details"] if d["library"] == "flashinfer")
    assert fi["mode"] == "verified" and fi["kernels"][0]["outcome"] == "local_hit"
    # The DeepGEMM task goes to its library, which cannot run without a GPU here: failed,
    # and none of its entries counted as a hit.
    assert dg["mode"] == "library" and not dg["ok"] and rc == 1
    assert report["kernels"]["local_hits"] == 1
    # One worker ran the task; DeepGEMM's kernel stage started its discovery process too.
    stage = report["kernel_stages"][0]
    assert stage["workers_started"] == 1 and report["workers_started"] == 2
    assert stage["nvcc_runs"] == 0 and stage["discovery_errors"]
    assert not imported["torch"]
