#!/usr/bin/env python3
"""Soak: warmups in a loop against a real redis-server under chaos; ends with 0 bad installs.

A few worker processes each warm plans of the tests' own JIT library (tests/testlib: entries
are directories of real, incompressible files, some of several 1 MiB chunks) through warmd's
real ``run_warmup`` (prefetch, single flight, compile in a worker process, publish) with a
signing key, on node directories that are sometimes wiped (cold nodes) and sometimes kept
(warm ones). Meanwhile one chaos loop injects a fault every few seconds:

    kill       SIGKILL the server, restart it on the same port a moment later (AOF kept)
    flushall   FLUSHALL
    maxmemory  maxmemory just above what is used, allkeys-lru, for a few seconds
    sleep      DEBUG SLEEP 3 (longer than warmd's 2 s timeout)
    corrupt    bytes of a few blob chunks overwritten
    truncate   a blob chunk cut in half
    wrongtype  the fingerprint list, the stats' node set, an index, a manifest or a task
               record replaced by a key of another Redis type
    proof      the key proof deleted (a keyless writer)
    unsigned   a manifest replaced by an unsigned copy (a keyless writer)

After every warmup each entry in the node's cache is checked against what its producer
compiled (the testlib's bytes are deterministic per name): a difference is a bad install.
Exit 0 when there was none and no warmup failed; the summary (``--json``) gives warmups,
faults by kind, entries checked, store counters summed over workers and each worker's RSS.

    python scripts/bench/soak_store.py [--minutes 20] [--workers 2] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
KEY = b"soak-cluster-key"
PASSWORD = "soak-pw"
PLANS = 3  # distinct plans the workers pick from
TASKS_PER_PLAN = 6
ENTRIES_PER_TASK = 2
SMALL, LARGE = 48 << 10, (2 << 20) + 4096  # a large entry spans three 1 MiB chunks
CONFIG = {"enable-debug-command": "yes"}  # Redis 7 refuses DEBUG SLEEP otherwise
FAULTS = ("kill", "flushall", "maxmemory", "sleep", "corrupt", "truncate", "wrongtype",
          "proof", "unsigned")


def _paths() -> None:
    """The repository and its tests' library importable here and in warmup's workers."""
    for path in (str(TESTS), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["WARMD_LIBRARY_PACKAGES"] = "testlib.library"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def plan_entries(plan: int) -> dict[str, tuple[list[str], int]]:
    """task key -> (entry names, size of each) of one plan; one task in three is large."""
    return {f"testlib/soak/{plan}/{t}": (
        [f"kernel.soak{plan}_{t}_{i}.{plan:02x}{t:02x}{i:02x}" for i in range(ENTRIES_PER_TASK)],
        LARGE if t % 3 == 0 else SMALL) for t in range(TASKS_PER_PLAN)}


# ----------------------------------------------------------------------------- workers

@dataclasses.dataclass
class WorkerResult:
    worker: int
    warmups: int = 0
    tasks_failed: int = 0
    entries_checked: int = 0
    bad_installs: int = 0
    kernels: dict = dataclasses.field(default_factory=dict)
    store: dict = dataclasses.field(default_factory=dict)
    rss_mib_first: float = 0.0
    rss_mib_last: float = 0.0
    rss_mib_max: float = 0.0
    rss_mib_by_minute: list = dataclasses.field(default_factory=list)
    errors: list = dataclasses.field(default_factory=list)


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _add(total: dict, counts: dict) -> None:
    for name, value in counts.items():
        if isinstance(value, (int, float)):
            total[name] = total.get(name, 0) + value


def _check_installed(root: Path, plans: list[int]) -> tuple[int, int]:
    """(entries checked, bad ones): every complete entry's files against its producer's."""
    from testlib.cache import entry_bytes

    checked = bad = 0
    for plan in plans:
        for names, size in plan_entries(plan).values():
            for name in names:
                path = root / name
                if not (path / "done").exists():
                    continue  # not there (or left half-written by a killed compile)
                checked += 1
                if (path / "kernel.bin").read_bytes() != entry_bytes(name, size) or \
                        (path / "done").read_text() != "ok":
                    bad += 1
    return checked, bad


@functools.lru_cache(maxsize=1)
def _base_plan():
    """A real plan, whose tasks _plan replaces with the test library's."""
    from warmd.plan import PlanRequest, make_plan

    return make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200", engine="sglang",
                                 without_libs=("sgl_kernel",)))


def _plan(plan: int):
    from testlib import NAME

    from warmd.tasks import Task

    tasks = tuple(Task(NAME, "write_entries", key=key, spec={"entries": names, "size": size})
                  for key, (names, size) in sorted(plan_entries(plan).items()))
    return dataclasses.replace(_base_plan(), tasks=tasks)


def worker_loop(index: int, url: str, deadline: float, base: str, seed: int, pause: float,
                results) -> None:
    _paths()
    import logging

    from testlib import NAME

    from warmd import libraries
    from warmd.store import open_shared_cache
    from warmd.warmup import WarmupOptions, run_warmup

    logging.getLogger("warmd").setLevel(logging.ERROR)  # thousands of expected warnings
    libraries.register("testlib.library")
    rng = random.Random(seed * 1000 + index)
    started = time.time()
    result = WorkerResult(index)
    nodes = [Path(base) / f"w{index}" / f"node{i}" for i in range(3)]
    plans = list(range(PLANS))
    while time.time() < deadline:
        time.sleep(rng.uniform(0, 2 * pause))  # the machine is shared: a modest load
        root = rng.choice(nodes)
        if rng.random() < 0.35:
            shutil.rmtree(root, ignore_errors=True)  # a cold node
        root.mkdir(parents=True, exist_ok=True)
        plan = rng.choice(plans)
        options = WarmupOptions(workers=1, gpu_ids=(), cache_roots={NAME: root},
                                single_flight_timeout=30)
        try:
            cache = open_shared_cache(url, signing_key=KEY, node=f"soak{index}",
                                      poll_interval=0.1, lease_seconds=10)
            try:
                report = run_warmup(_plan(plan), options, shared=cache)
            finally:
                cache.close()
        except Exception as exc:  # a warmup must never raise: that is a finding
            result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            continue
        result.warmups += 1
        result.tasks_failed += len(report.failed)
        result.errors += [f"{r.task.key}: {r.result.error}"[:300] for r in report.failed[:2]]
        _add(result.kernels, report.counters.kernel_counts())
        _add(result.store, report.store_counts)
        checked, bad = _check_installed(root, plans)
        result.entries_checked += checked
        result.bad_installs += bad
        rss = _rss_mib()
        result.rss_mib_first = result.rss_mib_first or rss
        result.rss_mib_last, result.rss_mib_max = rss, max(result.rss_mib_max, rss)
        minute = int((time.time() - started) // 60)
        if len(result.rss_mib_by_minute) <= minute:
            result.rss_mib_by_minute.append(round(rss, 1))
    results.put(dataclasses.asdict(result))


# ----------------------------------------------------------------------------- chaos

class Chaos:
    def __init__(self, data_dir: Path, seed: int) -> None:
        from warmd.store import start_server

        self.data_dir = data_dir
        self.server = start_server(data_dir, password=PASSWORD, appendonly=True, config=CONFIG)
        self.rng = random.Random(seed)
        self.done: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.failed: list[str] = []
        self.stop = threading.Event()

    @property
    def url(self) -> str:
        return self.server.url

    def run(self, interval: tuple[float, float]) -> None:
        while not self.stop.wait(self.rng.uniform(*interval)):
            fault = self.rng.choice(FAULTS)
            try:
                getattr(self, f"_{fault}")()
                self.done[fault] += 1
            except Exception as exc:  # the server may be down or asleep: try another later
                self.failed.append(f"{fault}: {type(exc).__name__}: {exc}"[:200])
            if not self.server.ping(2.0):
                self._restart()

    def _client(self):
        return self.server.client(timeout=5.0)

    def _restart(self) -> None:
        from warmd.store import start_server

        self.server = start_server(self.data_dir, password=PASSWORD, appendonly=True,
                                   port=self.server.port, config=CONFIG)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.server.pid, signal.SIGKILL)
        time.sleep(self.rng.uniform(0.5, 3.0))
        self._restart()

    def _flushall(self) -> None:
        self._client().flushall()

    def _maxmemory(self) -> None:
        client = self._client()
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.config_set("maxmemory", str(used + (2 << 20)))
        time.sleep(self.rng.uniform(2.0, 6.0))
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", "volatile-lru")

    def _sleep(self) -> None:
        self._client().execute_command("DEBUG", "SLEEP", "3")

    def _keys(self, pattern: str, count: int) -> list[bytes]:
        keys = list(self._client().scan_iter(match=pattern, count=1000))
        return self.rng.sample(keys, min(count, len(keys)))

    def _corrupt(self) -> None:
        from warmd.store import layout

        for key in self._keys(layout.blob_keys_pattern(), 3):
            self._client().setrange(key, self.rng.randrange(0, 4096), b"CHAOS")

    def _truncate(self) -> None:
        from warmd.store import layout

        client = self._client()
        for key in self._keys(layout.blob_keys_pattern(), 1):
            value = client.get(key) or b""
            client.set(key, value[:len(value) // 2], keepttl=True)

    def _wrongtype(self) -> None:
        from warmd.store import layout

        choices = [layout.FPS_KEY, layout.NODES_KEY,
                   *self._keys(f"{layout.used_prefix()}*", 1),
                   *self._keys(f"{layout.PREFIX}man:*", 1),
                   *self._keys(f"{layout.PREFIX}task:*", 1)]
        key = self.rng.choice(choices)
        client = self._client()
        client.delete(key)
        client.hset(key, "chaos", "1")

    def _proof(self) -> None:
        from warmd.store import layout

        self._client().delete(layout.KEY_PROOF_KEY)

    def _unsigned(self) -> None:
        for key in self._keys("warmd:v1:man:*", 1):
            client = self._client()
            raw = client.get(key)
            if raw:
                data = json.loads(raw)
                data.pop("sig", None)
                client.set(key, json.dumps(data, sort_keys=True), keepttl=True)


# ----------------------------------------------------------------------------- main

def soak(seconds: float, workers: int, seed: int, interval: tuple[float, float],
         pause: float = 0.0) -> dict:
    _paths()
    base = Path(tempfile.mkdtemp(prefix="warmd-soak-"))
    os.environ["WARMD_STATE_DIR"] = str(base / "state")
    chaos = Chaos(base / "redis", seed)
    started = time.time()
    deadline = started + seconds
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker_loop, args=(i, chaos.url, deadline, str(base), seed,
                                                   pause, results)) for i in range(workers)]
    for proc in procs:
        proc.start()
    thread = threading.Thread(target=chaos.run, args=(interval,), daemon=True)
    thread.start()
    collected = []
    try:
        for _ in procs:  # a warmup may run past the deadline: allow it a few minutes
            collected.append(results.get(timeout=max(1.0, deadline - time.time()) + 300))
    finally:
        chaos.stop.set()
        thread.join(30)
        proof = _proof_state(chaos.url)
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        chaos.server.stop()
        shutil.rmtree(base, ignore_errors=True)
    totals: dict = {}
    for key in ("warmups", "tasks_failed", "entries_checked", "bad_installs"):
        totals[key] = sum(r[key] for r in collected)
    kernels: dict = {}
    store: dict = {}
    for r in collected:
        _add(kernels, r["kernels"])
        _add(store, r["store"])
    return {"seconds": round(time.time() - started, 1), "workers": workers, "seed": seed,
            "key_proof_at_end": proof,
            **totals, "faults": chaos.done, "faults_total": sum(chaos.done.values()),
            "fault_errors": len(chaos.failed), "fault_error_samples": chaos.failed[:5],
            "kernels": kernels,
            "store_counters": {k: round(v, 3) if isinstance(v, float) else v
                               for k, v in sorted(store.items())},
            "rss_mib": [{"worker": r["worker"], "first": round(r["rss_mib_first"], 1),
                         "last": round(r["rss_mib_last"], 1),
                         "max": round(r["rss_mib_max"], 1),
                         "by_minute": r["rss_mib_by_minute"]} for r in collected],
            "errors": [e for r in collected for e in r["errors"]][:10]}


def _proof_state(url: str) -> str:
    """The key proof as a node with the cluster's key finds it once the chaos stopped (a
    node opening the store writes a missing one again)."""
    from warmd.store import open_shared_cache

    with open_shared_cache(url, signing_key=KEY, node="soak-check") as cache:
        return str(cache.key_proof)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, help="instead of --minutes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-every", type=float, nargs=2, default=(4.0, 12.0),
                        metavar=("MIN", "MAX"), help="seconds between faults (uniform)")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="mean seconds each worker rests between warmups")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers < 1 or (args.seconds or args.minutes) <= 0:
        print("soak_store: --workers and the duration must be positive", file=sys.stderr)
        return 2
    summary = soak(args.seconds or args.minutes * 60, args.workers, args.seed,
                   tuple(args.fault_every), args.pause)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['seconds']:.0f} s, {summary['workers']} workers: "
              f"{summary['warmups']} warmups, {summary['faults_total']} faults "
              f"({', '.join(f'{k} {v}' for k, v in summary['faults'].items())}); "
              f"{summary['entries_checked']} installed entries checked, "
              f"{summary['bad_installs']} bad; {summary['tasks_failed']} tasks failed")
        print(f"kernels: {summary['kernels']}")
        print(f"store: {summary['store_counters']}")
        print(f"worker RSS (MiB): {summary['rss_mib']}; key proof at the end: "
              f"{summary['key_proof_at_end']}")
        for error in summary["errors"]:
            print(f"error: {error}")
    ok = (summary["bad_installs"] == 0 and summary["tasks_failed"] == 0
          and not summary["errors"] and summary["key_proof_at_end"] == "ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
