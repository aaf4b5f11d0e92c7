"""The checks of scripts/bench/speed_bench.py over its steps' rows: a cold warmup compiled
exactly the distinct entries and discovery found every kernel; a warm one compiled nothing,
started no worker and never imported torch; and the nvcc floor (one kernel, a wave of one
per core, the plan's every source in a pool) that no warmup can beat on this machine."""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speed_bench import Bench


def stage_of(row: dict | None) -> dict:
    data = (row or {}).get("json") or {}
    stages = data.get("kernel_stages") or []
    return stages[0] if stages else {}


def check_cold(bench: Bench, name: str, row: dict | None) -> None:
    if row is None:
        return
    stage, data = stage_of(row), row.get("json") or {}
    kernels = data.get("kernels") or {}
    bench.check(f"{name}: ok", row["rc"] == 0 and not data.get("tasks_failed"),
                {"rc": row["rc"], "tasks_failed": data.get("tasks_failed")})
    bench.check(f"{name}: compiles == distinct entries",
                stage.get("nvcc_runs") == row.get("new_entries") == kernels.get("compiled")
                and not stage.get("nvcc_failed"),
                {"nvcc_runs": stage.get("nvcc_runs"), "new_entries": row.get("new_entries"),
                 "reported_compiled": kernels.get("compiled"),
                 "discovered": stage.get("discovered_kernels"),
                 "discovery_s": stage.get("discovery_seconds"),
                 "discovery_errors": stage.get("discovery_errors")})
    # Discovery (unfilled inputs, placeholder kernels) asked for every kernel the real run
    # needed: none was left for the workers to find.
    bench.check(f"{name}: discovery found every kernel",
                stage.get("discovered_kernels") == stage.get("kernel_jobs")
                == row.get("new_entries"),
                {"discovered": stage.get("discovered_kernels"),
                 "kernel_jobs": stage.get("kernel_jobs"), "new_entries": row.get("new_entries"),
                 "timeline": stage.get("timeline")})


def check_warm(bench: Bench, name: str, row: dict | None, cold: dict | None) -> None:
    if row is None:
        return
    data = row.get("json") or {}
    kernels, imported = data.get("kernels") or {}, (row.get("probe") or {}).get("imported")
    bench.check(f"{name}: nothing compiled, every hit verified, no worker, no torch",
                row["rc"] == 0 and kernels.get("compiled") == 0 and kernels.get("total")
                and (data.get("hits_by_mode") or {}).get("library") == 0
                and data.get("workers_started") == 0 and imported is not None
                and not imported.get("torch") and not imported.get("deep_gemm"),
                {"kernels": kernels, "modes": data.get("hits_by_mode"),
                 "workers_started": data.get("workers_started"), "imported": imported,
                 "new_entries": row.get("new_entries")})
    if cold is not None:
        share = row["wall_s"] / cold["wall_s"]
        bench.results["checks"].setdefault("ratios", {})[f"{name} / cold"] = round(share, 4)


def nvcc_floor(bench: Bench, cold: dict | None) -> dict | None:
    """One kernel's nvcc time (median of three, one at a time) and one wave of one kernel
    per core, with DeepGEMM's own command on the plan's own kernel sources."""
    stage = stage_of(cold)
    args, nvcc = stage.get("nvcc_args"), stage.get("nvcc")
    cache = Path(cold["cache"]) if cold else None
    if not args or not nvcc or cache is None or bench.skip("floor", 70):
        return None
    every = sorted(cache.glob("cache/kernel.*/kernel.cu"), key=lambda p: p.parent.name)
    sources = [p for p in every if "transpose" not in p.parent.name]
    if not sources:
        return None
    scratch = Path(tempfile.mkdtemp(prefix="floor-", dir=bench.work))

    def compile_one(index_source) -> float:
        index, source = index_source
        out = scratch / f"{index}.cubin"
        command = [nvcc, *(str(source) if a == "{source}" else str(out) if a == "{output}"
                           else a for a in args)]
        began = time.monotonic()
        subprocess.run(command, cwd=scratch, check=True, capture_output=True)
        return time.monotonic() - began

    bench.log(f"RUN  floor: {len(sources)} GEMM kernel sources, {bench.cores} cores")
    try:
        return _floor(bench, cold, sources, every, compile_one)
    except (OSError, subprocess.CalledProcessError) as exc:
        bench.results["steps"]["floor"] = {"error": f"{type(exc).__name__}: {exc}"}
        bench.save()
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _floor(bench: Bench, cold: dict, sources: list[Path], every: list[Path],
           compile_one) -> dict:
    singles = [compile_one((i, sources[i * len(sources) // 3])) for i in range(3)]
    wave_sources = [(100 + i, sources[i % len(sources)]) for i in range(bench.cores)]
    began = time.monotonic()
    with ThreadPoolExecutor(bench.cores) as pool:
        in_wave = list(pool.map(compile_one, wave_sources))
    wave = time.monotonic() - began
    # Every source of the plan known at once, one nvcc per core from a queue, nothing else
    # running: the compile time no warmup can beat on this machine (no discovery, no GPU).
    began = time.monotonic()
    with ThreadPoolExecutor(bench.cores) as pool:
        in_pool = list(pool.map(compile_one, enumerate(every, start=1000)))
    pooled = time.monotonic() - began
    distinct = cold.get("new_entries") or 0
    one = statistics.median(singles)
    row = {"one_kernel_s": [round(s, 3) for s in singles], "one_kernel_median_s": round(one, 3),
           "wave_of_cores_s": round(wave, 3), "per_kernel_in_wave_s": round(max(in_wave), 3),
           "pool_s": round(pooled, 3), "pool_kernels": len(every),
           "pool_nvcc_sum_s": round(sum(in_pool), 3),
           "distinct_kernels": distinct, "cores": bench.cores,
           "floor_s": round(distinct / bench.cores * one, 3),
           "wave_floor_s": round(math.ceil(distinct / bench.cores) * wave, 3)}
    bench.results["steps"]["floor"] = row
    bench.save()
    bench.log(f"DONE floor: {row}")
    return row
