#!/usr/bin/env python3
"""Round trips to a Redis store per shared-cache operation, counted at redis-py's client
(one pipeline is one round trip, one command outside a pipeline is one), against a loopback
server this script starts (warmd's embedded one):

    python scripts/bench/store_round_trips.py [--entries 4] [--json]

Operations, each counted alone, on DeepGEMM-shaped entries (bench_store_fetch.make_entries,
kernel.cubin of 100-150 KB: one chunk each):

  publish        one task of N entries, none stored before (node A)
  publish again  the same task and entries, all stored (node A, a second process's view)
  prefetch       the task on an empty node B: record, manifests, chunks, install, renewal
  prefetch warm  the same on node B again (nothing to install; the renewal marker is set)
  flush x P      P nodes (threads, each its own cache) flushing counters of one fingerprint
                 at once, three times each: every round trip of all of them, retries of
                 lost compare-and-sets included (--nodes P, default 8)

A count, not a timing: the same on every run and every machine, but for the flushes,
whose lost compare-and-sets depend on the timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from bench_store_fetch import make_entries

from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.store import open_shared_cache, start_server


class RoundTrips:
    """Counts redis-py's round trips while counting: Pipeline.execute, and
    Redis.execute_command called outside a pipeline. Patches redis-py while entered."""

    def __init__(self) -> None:
        self.count = 0
        self.on = False
        self._saved = (redis.Redis.execute_command, redis.client.Pipeline.execute)
        self._lock = threading.Lock()

    def __enter__(self) -> RoundTrips:
        command, execute = self._saved

        def counted_command(client, *args, **kwargs):
            if self.on and not isinstance(client, redis.client.Pipeline):
                self._add()
            return command(client, *args, **kwargs)

        def counted_execute(pipe, *args, **kwargs):
            if self.on:
                self._add()
            return execute(pipe, *args, **kwargs)

        redis.Redis.execute_command = counted_command
        redis.client.Pipeline.execute = counted_execute
        return self

    def _add(self) -> None:
        with self._lock:  # flushing nodes count from several threads
            self.count += 1

    def __exit__(self, *_exc) -> None:
        redis.Redis.execute_command, redis.client.Pipeline.execute = self._saved

    @contextmanager
    def counting(self) -> Iterator[Callable[[], int]]:
        self.count, self.on = 0, True
        try:
            yield lambda: self.count
        finally:
            self.on = False


def measure(entries: int, work: Path, nodes: int = 8) -> dict[str, int]:
    """Each operation's round trips (see the module), on a server of its own under work."""
    server = start_server(work / "redis", appendonly=False)
    try:
        with RoundTrips() as trips:
            return _steps(trips, server.url, entries, work, nodes)
    finally:
        server.stop()


def _steps(trips: RoundTrips, url: str, entries: int, work: Path, nodes: int
           ) -> dict[str, int]:
    out: dict[str, int] = {}
    (task, names), = make_entries(work / "a", entries, per_task=entries).items()
    writer = open_shared_cache(url, node="a")
    adapter = DeepGemmCacheAdapter(work / "a", arch="9.0a", sms=132)
    found = {e.name: e for e in adapter.list_entries()}
    for step in ("publish", "publish again"):
        with trips.counting() as count:
            writer.entries.publish_task(adapter, task, [found[n] for n in names], 3.0)
        out[step] = count()
    writer.close()
    reader = open_shared_cache(url, node="b")
    empty = DeepGemmCacheAdapter(work / "b", arch="9.0a", sms=132)
    for step in ("prefetch", "prefetch warm"):
        with trips.counting() as count:
            got = reader.entries.prefetch(empty, [task])
        out[step] = count()
        if got.get(task) is None or len(got[task]) != entries:
            raise SystemExit(f"store_round_trips: {step} found {got.get(task)!r}")
    reader.close()
    out[f"flush x {nodes}"] = _flushes(trips, url, nodes)
    return out


def _flushes(trips: RoundTrips, url: str, nodes: int, rounds: int = 3) -> int:
    caches = [open_shared_cache(url, node=f"flusher{i}") for i in range(nodes)]
    for cache in caches:  # each node's first flush lists it: not what is measured
        cache.stats.count("tasks_hit", 1, fp="f" * 64)
        cache.stats.flush()
    start = threading.Barrier(nodes)

    def flush(cache) -> None:
        for _ in range(rounds):
            start.wait()
            cache.stats.count("tasks_hit", 1, fp="f" * 64)
            cache.stats.flush()

    with trips.counting() as count:
        threads = [threading.Thread(target=flush, args=(c,)) for c in caches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for cache in caches:
        cache.close()
    return count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.entries < 1 or args.nodes < 1:
        print("store_round_trips: --entries and --nodes must be 1 or more", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="round-trips-") as tmp:
        counts = measure(args.entries, Path(tmp), args.nodes)
    if args.json:
        print(json.dumps({"entries": args.entries, "round_trips": counts}))
    else:
        for step, count in counts.items():
            print(f"{step:<14} {count:>4} round trips ({args.entries} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
