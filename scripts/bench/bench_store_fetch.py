#!/usr/bin/env python3
"""Fetch throughput of the shared cache against redis-benchmark GET of the same value size.

Publishes N DeepGEMM-shaped entries (kernel.cu + an incompressible kernel.cubin of 100-150 KB,
the sizes measured on the H200) through warmd's store into a loopback Redis, then times:

* fetch+verify: task records, manifests and blobs in warmd's pipelined round trips, with every
  blob's SHA-256 checked (what a node does before installing);
* fetch+verify+install: the same plus DeepGemmCacheAdapter.install (atomic, fsynced) into a
  fresh cache root, i.e. ``StoreSharedCache.entries.prefetch``;

and compares entries/s with ``redis-benchmark -t get -d <mean artifact size>`` requests/s on the
same server (one connection, pipelined like warmd's fetch; also redis-benchmark's default of
50 connections). Usage:

    python scripts/bench/bench_store_fetch.py [--entries 100] [--repeat 5] [--redis URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.store import open_shared_cache, start_server


def make_entries(root: Path, count: int, per_task: int, seed: int = 7) -> dict[str, list]:
    """count entries shaped like DeepGEMM's, grouped into tasks of per_task entries."""
    import random

    rng = random.Random(seed)
    adapter = DeepGemmCacheAdapter(root, arch="9.0a", sms=132)
    tasks: dict[str, list] = {}
    for i in range(count):
        name = f"kernel.sm90_fp8_gemm_1d2d.{i:032x}"
        path = adapter.entries_dir / name
        path.mkdir(parents=True)
        (path / "kernel.cu").write_text(f"// kernel {i}\n" + "x" * 500)
        (path / "kernel.cubin").write_bytes(os.urandom(rng.randint(100_000, 150_000)))
        tasks.setdefault(f"deep_gemm/bench/{i // per_task:04d}", []).append(name)
    return tasks


def publish(cache, root: Path, tasks: dict[str, list]) -> tuple[DeepGemmCacheAdapter, int]:
    adapter = DeepGemmCacheAdapter(root, arch="9.0a", sms=132)
    entries = {e.name: e for e in adapter.list_entries()}
    total = 0
    for task, names in tasks.items():
        total += sum(len(adapter.pack(entries[n])) for n in names)
        cache.entries.publish_task(adapter, task, [entries[n] for n in names], 3.0)
    return adapter, total


def time_fetch_verify(cache, adapter, tasks: dict[str, list]) -> float:
    """Records, manifests, blobs and digests: no install."""
    fp = cache.fingerprint(adapter)
    start = time.perf_counter()
    records = cache.entries.read_records(fp.digest, list(tasks))
    names = sorted({n for rec, _raw in records.values() for n in rec.entries})
    manifests = cache.entries.read_manifests(fp, names)
    blobs = cache.blobs.read_blobs([man for man, _raw in manifests.values()])
    elapsed = time.perf_counter() - start
    assert len(blobs) == len(names) and all(isinstance(b, bytes) for b in blobs.values())
    return elapsed


def time_prefetch(cache, tmp: Path, tasks: dict[str, list], run: int) -> float:
    dest = DeepGemmCacheAdapter(tmp / f"dest{run}", arch="9.0a", sms=132)
    start = time.perf_counter()
    got = cache.entries.prefetch(dest, list(tasks))
    elapsed = time.perf_counter() - start
    assert all(got[t] == names for t, names in tasks.items()), "prefetch missed entries"
    shutil.rmtree(dest.root)
    return elapsed


def redis_benchmark(url: str, size: int, clients: int, pipeline: int, requests: int) -> dict:
    parts = urlsplit(url)
    cmd = ["redis-benchmark", "-h", parts.hostname, "-p", str(parts.port), "-t", "get",
           "-d", str(size), "-n", str(requests), "-c", str(clients), "-P", str(pipeline),
           "--csv"]
    auth = ["-a", parts.password] if parts.password else []
    out = subprocess.run(cmd + auth, capture_output=True, text=True, check=True).stdout
    row = [line for line in out.splitlines() if line.startswith('"GET"')][0]
    rps = float(row.split(",")[1].strip('"'))
    shown = " ".join(c for c in cmd if c != "--csv") + (" -a ***" if auth else "")
    return {"command": shown, "requests_per_s": rps}


def seed_benchmark_key(cache, size: int) -> None:
    # redis-benchmark GETs the literal key "key:__rand_int__": give it a value of this size.
    cache.op(lambda c: c.set("key:__rand_int__", os.urandom(size)), "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--per-task", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--redis", help="an existing server (default: start one on loopback)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not shutil.which("redis-benchmark"):
        sys.exit("bench_store_fetch: redis-benchmark not found on PATH")
    with tempfile.TemporaryDirectory(prefix="warmd-bench-") as tmp_name:
        tmp = Path(tmp_name)
        server = None if args.redis else start_server(tmp / "redis", appendonly=False,
                                                      password="bench")
        url = args.redis or server.url
        try:
            result = run(url, tmp, args)
        finally:
            if server is not None:
                server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:<34} {value}")


def run(url: str, tmp: Path, args) -> dict:
    cache = open_shared_cache(url, node="bench")
    tasks = make_entries(tmp / "src", args.entries, args.per_task)
    adapter, total = publish(cache, tmp / "src", tasks)
    mean = total // args.entries
    time_fetch_verify(cache, adapter, tasks)  # warm the connection and scripts
    fetch = [time_fetch_verify(cache, adapter, tasks) for _ in range(args.repeat)]
    install = [time_prefetch(cache, tmp, tasks, r) for r in range(args.repeat)]
    seed_benchmark_key(cache, mean)
    cache.close()
    requests = max(1000, 20 * args.entries)
    single = redis_benchmark(url, mean, 1, 16, requests)
    default = redis_benchmark(url, mean, 50, 1, requests)
    fetch_rate = args.entries / statistics.median(fetch)
    install_rate = args.entries / statistics.median(install)
    return {
        "entries": args.entries, "tasks": len(tasks), "mean_artifact_bytes": mean,
        "fetch_verify_s_median": round(statistics.median(fetch), 4),
        "fetch_verify_entries_per_s": round(fetch_rate, 1),
        "fetch_verify_install_s_median": round(statistics.median(install), 4),
        "fetch_verify_install_entries_per_s": round(install_rate, 1),
        "redis_benchmark_get_per_s_c1_P16": single["requests_per_s"],
        "redis_benchmark_get_per_s_c50": default["requests_per_s"],
        "ratio_fetch_verify_vs_c1_P16": round(fetch_rate / single["requests_per_s"], 3),
        "ratio_fetch_verify_install_vs_c1_P16": round(install_rate / single["requests_per_s"],
                                                      3),
        "ratio_fetch_verify_vs_c50": round(fetch_rate / default["requests_per_s"], 3),
        "redis_benchmark_c1_P16": single["command"],
        "redis_benchmark_c50": default["command"],
    }


if __name__ == "__main__":
    main()
