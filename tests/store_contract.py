"""The store contract: what every backend of warmd.store.api must do, through the interface
only (no keys, no client of the backend's own).

A backend's test module subclasses StoreContract and provides a `backend` fixture returning a
Backend (see tests/store/test_store_contract.py for Redis). Entries are real directories packed and
installed by the test library's adapter (store_support.DirAdapter).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_support import DirAdapter, publish_entries, task_entries

from warmd.store import NodeRecords, SharedCache


@dataclass
class Backend:
    open: Callable[..., SharedCache]  # a new node's cache on one shared, empty store
    open_down: Callable[[], SharedCache]  # a cache whose store does not answer
    open_off: Callable[[], SharedCache]  # a cache turned off by configuration
    records: Callable[[str], NodeRecords]  # node records of a namespace (decoded as dicts)
    records_down: Callable[[str], NodeRecords]
    secret: str  # the password in the store's URL: never shown


@dataclass
class Node:
    """A node record as the daemon writes them (warmd.cluster.state.NodeState's shape)."""

    node_id: str
    state: str = "READY"

    def to_json(self) -> dict:
        return {"node_id": self.node_id, "state": self.state}


def same_files(a: DirAdapter, b: DirAdapter, name: str) -> bool:
    return (a.root / name / "kernel.bin").read_bytes() == (b.root / name / "kernel.bin"
                                                           ).read_bytes()


def wait_in_thread(cache: SharedCache, task: str, settle: float
                   ) -> tuple[threading.Thread, dict]:
    """Enter cache.claims.single_flight(task) in a thread (seen["mine"] once it answers), then
    give it `settle` seconds to start waiting."""
    seen: dict = {}

    def wait() -> None:
        with cache.claims.single_flight(task, 20) as mine:
            seen["mine"] = mine

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(settle)
    return thread, seen


class StoreContract:
    # ------------------------------------------------------------------- fetch and publish

    def test_published_entries_install_on_another_node(self, backend: Backend, tmp_path: Path):
        a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
        writer, reader = backend.open(), backend.open()
        publish_entries(writer, a, "testlib/t1", ["kernel.x.0001", "kernel.y.0001"])
        assert reader.entries.fetch_task(b, "testlib/t1") == ["kernel.x.0001", "kernel.y.0001"]
        assert all(same_files(a, b, n) for n in ("kernel.x.0001", "kernel.y.0001"))
        assert reader.stats.counters["remote_hits"] == 2
        assert reader.stats.counters["compile_seconds_saved"] == pytest.approx(2.0)
        # each installed entry's recorded compile time, for the node's report and records
        assert sum(reader.entries.installed_seconds(b.library, n) for n in ("kernel.x.0001",
                                                                    "kernel.y.0001")) \
            == pytest.approx(2.0)
        assert writer.entries.installed_seconds(a.library, "kernel.x.0001") is None  # not installed
        # where the fetch spent its time: reading the store, writing the local cache
        assert reader.stats.counters["fetch_seconds"] > 0
        assert reader.stats.counters["install_seconds"] > 0
        assert writer.stats.counters["published"] == 2
        assert "fetch_seconds" not in writer.stats.counters  # publishing fetches nothing

    def test_a_task_nobody_published_is_a_miss(self, backend: Backend, tmp_path: Path):
        cache = backend.open()
        assert cache.entries.fetch_task(DirAdapter(tmp_path / "a"), "testlib/unknown") is None
        assert "remote_hits" not in cache.stats.counters

    def test_entries_already_here_are_local_hits(self, backend: Backend, tmp_path: Path):
        a = DirAdapter(tmp_path / "a")
        cache = backend.open()
        publish_entries(cache, a, "testlib/t", ["kernel.x.0001"])
        assert cache.entries.fetch_task(a, "testlib/t") == ["kernel.x.0001"]
        assert cache.stats.counters["local_hits"] == 1 and "remote_hits" not in cache.stats.counters

    def test_prefetch_answers_like_fetch_per_task(self, backend: Backend, tmp_path: Path):
        a = DirAdapter(tmp_path / "a")
        writer = backend.open()
        plan = task_entries(4)
        for task, names in list(plan.items())[:3]:
            publish_entries(writer, a, task, names)
        got = backend.open().entries.prefetch(DirAdapter(tmp_path / "b"), list(plan))
        expected = {t: (names if i < 3 else None) for i, (t, names) in enumerate(plan.items())}
        assert got == expected

    def test_an_entry_published_twice_is_stored_once(self, backend: Backend, tmp_path: Path):
        one, two = backend.open(), backend.open()
        publish_entries(one, DirAdapter(tmp_path / "a"), "testlib/t", ["kernel.same.0001"])
        publish_entries(two, DirAdapter(tmp_path / "b"), "testlib/t", ["kernel.same.0001"])
        assert one.stats.counters["published"] == 1 and two.stats.counters["already_published"] == 1

    # ------------------------------------------------------------------- single flight

    def test_single_flight_one_compiles_the_other_gets_the_publication(
            self, backend: Backend, tmp_path: Path):
        holder, waiter = backend.open(), backend.open()
        a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
        assert holder.entries.fetch_task(a, "testlib/sf") is None
        assert waiter.entries.fetch_task(b, "testlib/sf") is None
        with holder.claims.single_flight("testlib/sf", 20) as mine:
            assert mine
            thread, seen = wait_in_thread(waiter, "testlib/sf", 0.5)
            assert "mine" not in seen  # waiting for the holder
            publish_entries(holder, a, "testlib/sf", ["kernel.sf.0001"])
        thread.join(10)
        assert seen["mine"] is False
        assert waiter.entries.fetch_task(b, "testlib/sf") == ["kernel.sf.0001"]
        assert waiter.stats.counters["lease_waits"] == 1
        assert waiter.stats.counters["lease_waits_satisfied"] == 1

    def test_single_flight_is_taken_over_when_the_holder_publishes_nothing(
            self, backend: Backend, tmp_path: Path):
        holder, waiter = backend.open(), backend.open()
        a = DirAdapter(tmp_path / "a")
        holder.entries.fetch_task(a, "testlib/fail")
        waiter.entries.fetch_task(a, "testlib/fail")
        with holder.claims.single_flight("testlib/fail", 20) as mine:
            assert mine
            thread, seen = wait_in_thread(waiter, "testlib/fail", 0.3)
        thread.join(10)
        assert seen["mine"] is True and waiter.stats.counters["lease_takeovers"] == 1

    def test_shard_order_is_a_rotation_that_differs_per_arrival(self, backend: Backend):
        keys = [f"testlib/t{i:02d}" for i in range(20)]
        first = backend.open().claims.shard_order(keys)
        second = backend.open().claims.shard_order(keys)
        for order in (first, second):
            start = keys.index(order[0])
            assert order == keys[start:] + keys[:start]
        assert first[0] != second[0]

    # ------------------------------------------------------------------- counters, health

    def test_counters_are_a_copy_and_outcomes_are_accepted(self, backend: Backend,
                                                           tmp_path: Path):
        cache = backend.open()
        publish_entries(cache, DirAdapter(tmp_path / "a"), "testlib/t", ["kernel.x.0001"])
        copy = cache.stats.counters
        copy["published"] = 99
        assert cache.stats.counters["published"] == 1
        cache.stats.record_outcomes({"compiled": 1, "testlib.compiled": 1, "bytes_fetched": 5})
        assert "bytes_fetched" not in cache.stats.counters  # only the store counts bytes it moved

    def test_health_of_a_reachable_store(self, backend: Backend):
        with backend.open() as cache:
            assert cache.ping() and cache.reachable
            assert cache.disabled_reason is None and not cache.last_error
            assert backend.secret not in cache.display_url

    def test_unreachable_store_degrades_to_local_work(self, backend: Backend, tmp_path: Path):
        cache = backend.open_down()
        a = DirAdapter(tmp_path / "a")
        started = time.monotonic()
        assert not cache.ping() and not cache.reachable
        assert cache.entries.fetch_task(a, "testlib/t") is None
        assert cache.entries.prefetch(a, ["testlib/t", "testlib/u"]) == {"testlib/t": None,
                                                                 "testlib/u": None}
        with cache.claims.single_flight("testlib/t", 30) as mine:
            assert mine
        publish_entries(cache, a, "testlib/t", ["kernel.x.0001"])
        assert cache.claims.shard_order(["b", "a"]) == ["b", "a"]
        cache.stats.record_outcomes({"compiled": 1})
        cache.close()
        assert time.monotonic() - started < 5
        assert cache.last_error and backend.secret not in cache.last_error
        assert cache.stats.counters["store_errors"] >= 1 and "published" not in cache.stats.counters
        assert backend.secret not in cache.display_url

    def test_a_store_turned_off_misses_and_says_why(self, backend: Backend, tmp_path: Path):
        cache = backend.open_off()
        a = DirAdapter(tmp_path / "a")
        assert cache.disabled_reason
        assert cache.entries.fetch_task(a, "testlib/t") is None
        with cache.claims.single_flight("testlib/t", 30) as mine:
            assert mine
        publish_entries(cache, a, "testlib/t", ["kernel.x.0001"])
        assert cache.stats.counters["publish_skipped"] == 1
        cache.close()

    # ------------------------------------------------------------------- node records

    def test_node_records_roundtrip_per_namespace(self, backend: Backend):
        one, two = backend.records("ns1"), backend.records("ns2")
        assert one.put(Node("a")) and one.put(Node("b", "PENDING")) and two.put(Node("c"))
        assert {r["node_id"]: r["state"] for r in one.get_all()} == {"a": "READY",
                                                                    "b": "PENDING"}
        assert one.delete("b") and [r["node_id"] for r in one.get_all()] == ["a"]
        assert [r["node_id"] for r in two.get_all()] == ["c"]
        assert one.put_daemon({"config_hash": "abc"})
        assert one.get_daemon() == {"config_hash": "abc"} and two.get_daemon() is None
        assert one.ping() and one.healthy and one.server_size()["keys"] >= 1
        assert one.delete_daemon() and one.get_daemon() is None
        one.close()
        two.close()

    def test_node_records_of_an_unreachable_store_answer_nothing(self, backend: Backend):
        records = backend.records_down("ns")
        assert records.put(Node("a")) is False
        assert records.get_all() is None and records.get_daemon() is None
        assert not records.ping() and not records.healthy
        assert records.errors >= 4 and records.last_error
        assert backend.secret not in records.last_error
        records.close()
