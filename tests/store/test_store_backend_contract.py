"""The KeyValueBackend contract (warmd.store.backend), the same tests on every backend: Redis
over a real redis-server, through the shared cache's transport, and SQLite over a file in
the test's temp dir; and the store's parts ported onto it, on both. What only Redis can have
(a key of another type) is tested last."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from store_support import module_server, start_test_server

from warmd.errors import WarmdInputError
from warmd.store import history, json_values, layout
from warmd.store.api import StoreFailed
from warmd.store.backend import NO_EXPIRY, KeyValueBackend, Put
from warmd.store.breaker import JoinBudget
from warmd.store.connection import parse_store_url
from warmd.store.counters import StoreStats, read_counts, read_fp_counts, read_nodes
from warmd.store.nodes import StoreNodeRecords
from warmd.store.redis_backend import RedisBackend
from warmd.store.sqlite_backend import SqliteBackend, sqlite_path
from warmd.store.transport import RedisTransport

server = module_server()


def redis_backend(url: str, join_budget: float = 5.0) -> RedisBackend:
    return RedisBackend(RedisTransport(
        parse_store_url(url), connect_timeout=1.0, socket_timeout=2.0, breaker=None,
        disabled_reason=None, count=lambda _name: None, budget=JoinBudget(join_budget)))


@pytest.fixture(params=["redis", "sqlite"])
def make(request, tmp_path) -> Callable[[], KeyValueBackend]:
    """A maker of backends over one empty store (each call another connection to it)."""
    made: list[KeyValueBackend] = []
    if request.param == "redis":
        srv = request.getfixturevalue("server")
        srv.client().flushall()
        build = lambda: redis_backend(srv.url)  # noqa: E731
    else:
        build = lambda: SqliteBackend(tmp_path / "store.db")  # noqa: E731

    def make() -> KeyValueBackend:
        made.append(build())
        return made[-1]

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def store(make) -> KeyValueBackend:
    return make()


def gone_within(store: KeyValueBackend, key: str, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if store.get(key) is None:
            return True
        time.sleep(0.02)
    return False


def test_a_value_put_is_read_back_and_absent_keys_read_none(store):
    assert store.put("a", b"one") is True
    assert store.put("b", b"\x00\xff") is True
    assert store.get_many(["a", "missing", "b", "a"]) == [b"one", None, b"\x00\xff", b"one"]
    assert store.get("missing") is None
    assert store.get_many([]) == []


def test_put_replaces_a_value_and_if_absent_never_does(store):
    assert store.put("k", b"first")
    assert store.put("k", b"second", if_absent=True) is False
    assert store.get("k") == b"first"
    assert store.put("k", b"third") is True
    assert store.get("k") == b"third"
    assert store.put("new", b"x", if_absent=True) is True
    assert store.get("new") == b"x"


def test_many_puts_are_each_a_put_answered_in_order(store):
    store.put("held", b"theirs")
    stored = store.put_many([Put("a", b"1"), Put("held", b"mine", if_absent=True),
                             Put("b", b"2", ttl_ms=60_000), Put("c", b"3", if_absent=True)])
    assert stored == [True, False, True, True]
    assert store.get_many(["a", "held", "b", "c"]) == [b"1", b"theirs", b"2", b"3"]
    assert store.ttl_ms("a") == NO_EXPIRY and 0 < store.ttl_ms("b") <= 60_000
    assert store.put_many([]) == []
    with pytest.raises(ValueError):  # a TTL under a millisecond is the caller's bug
        store.put_many([Put("d", b"4"), Put("e", b"5", ttl_ms=0)])
    assert store.get("d") is None  # refused before anything was written


def test_many_expires_say_which_keys_were_there(store):
    store.put_many([Put("a", b"1"), Put("b", b"2", ttl_ms=60_000)])
    assert store.expire_many(["a", "gone", "b"], 150) == [True, False, True]
    assert 0 < store.ttl_ms("a") <= 150 and 0 < store.ttl_ms("b") <= 150
    assert store.expire_many([], 150) == []
    assert gone_within(store, "a") and gone_within(store, "b")


def test_compare_and_set_writes_only_over_the_expected_value(store):
    assert store.compare_and_set("k", None, b"v1") is True  # absent, as expected
    assert store.compare_and_set("k", None, b"v2") is False  # no longer absent
    assert store.compare_and_set("k", b"other", b"v2") is False
    assert store.get("k") == b"v1"
    assert store.compare_and_set("k", b"v1", b"v2") is True
    assert store.get("k") == b"v2"
    assert store.compare_and_set("absent", b"v1", b"v2") is False
    assert store.get("absent") is None


def test_compare_and_set_to_none_deletes_only_the_expected_value(store):
    store.put("k", b"mine")
    assert store.compare_and_set("k", b"theirs", None) is False
    assert store.get("k") == b"mine"
    assert store.compare_and_set("k", b"mine", None) is True
    assert store.get("k") is None
    assert store.put("k", b"again", if_absent=True)  # gone, not hidden


def test_an_empty_value_is_a_value_not_an_absence(store):
    store.put("k", b"")
    assert store.get("k") == b""
    assert store.put("k", b"x", if_absent=True) is False
    assert store.compare_and_set("k", None, b"x") is False
    assert store.compare_and_set("k", b"", b"x") is True


def test_prefix_reads_return_at_most_what_was_asked_in_the_order_asked(store):
    store.put("big", b"0123456789")
    store.put("small", b"ab")
    assert store.get_prefixes([("big", 4), ("small", 4), ("absent", 3), ("big", 11)]) == [
        b"0123", b"ab", b"", b"0123456789"]
    assert store.get_prefixes([]) == []
    with pytest.raises(ValueError):
        store.get_prefixes([("big", 0)])


def test_a_key_expires_after_its_ttl_and_is_then_absent_to_every_operation(store):
    store.put("short", b"v", ttl_ms=150)
    store.put("long", b"v", ttl_ms=60_000)
    store.compare_and_set("cas", None, b"v", ttl_ms=150)
    assert store.get("short") == b"v"
    assert 0 < store.ttl_ms("short") <= 150
    assert gone_within(store, "short") and gone_within(store, "cas")
    assert store.ttl_ms("short") is None
    assert store.get("long") == b"v"
    assert store.put("short", b"new", if_absent=True) is True
    assert store.compare_and_set("cas", None, b"new") is True


def test_a_key_without_ttl_lives_on_and_a_plain_put_drops_an_old_ttl(store):
    store.put("forever", b"v")
    assert store.ttl_ms("forever") == NO_EXPIRY
    store.put("k", b"v", ttl_ms=60_000)
    store.put("k", b"w")
    assert store.ttl_ms("k") == NO_EXPIRY


def test_expire_sets_a_new_ttl_and_is_false_on_a_gone_key(store):
    store.put("k", b"v")
    assert store.expire("k", 150) is True
    assert 0 < store.ttl_ms("k") <= 150
    assert gone_within(store, "k")
    assert store.expire("k", 1000) is False
    assert store.expire("never", 1000) is False
    assert store.ttl_ms("never") is None


def test_a_ttl_under_one_millisecond_is_a_callers_bug(store):
    for call in (lambda: store.put("k", b"v", ttl_ms=0), lambda: store.expire("k", -5),
                 lambda: store.compare_and_set("k", None, b"v", ttl_ms=0)):
        with pytest.raises(ValueError):
            call()
    assert store.get("k") is None


def test_scan_finds_every_key_under_the_prefix_and_no_other(store):
    for key in ("p:1", "p:2", "p:sub:3", "pq:4", "q:p:5", "x*[1", "xy[2", "x*[\U0010ffff"):
        store.put(key, b"v")
    assert sorted(store.scan("p:")) == ["p:1", "p:2", "p:sub:3"]
    assert sorted(store.scan("x*[")) == ["x*[1", "x*[\U0010ffff"]  # glob marks are literal
    assert list(store.scan("none:")) == []
    assert len(list(store.scan(""))) == 8


def test_delete_removes_keys_and_counts_those_that_were_there(store):
    store.put("a", b"1")
    store.put("b", b"2")
    store.put("c", b"3")
    assert store.delete(["a", "b", "missing"]) == 2
    assert store.get_many(["a", "b", "c"]) == [None, None, b"3"]
    assert store.delete([]) == 0


def test_concurrent_compare_and_set_has_exactly_one_winner(make):
    stores = [make() for _ in range(8)]  # one connection each
    start = threading.Barrier(len(stores))
    won: list[int] = []

    def claim(i: int) -> None:
        start.wait()
        if stores[i].compare_and_set("claim", None, f"node-{i}".encode()):
            won.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(won) == 1
    assert stores[0].get("claim") == f"node-{won[0]}".encode()


def test_compare_and_set_loops_from_threads_lose_no_update(make):
    stores = [make() for _ in range(4)]
    stores[0].put("counter", b"0")

    def add(store: KeyValueBackend, times: int) -> None:
        for _ in range(times):
            while True:
                seen = store.get("counter")
                if store.compare_and_set("counter", seen, str(int(seen) + 1).encode()):
                    break

    threads = [threading.Thread(target=add, args=(s, 25)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert stores[0].get("counter") == b"100"


def test_the_ported_consumers_work_on_any_backend(store, tmp_path):
    """What sits on the interface (counters, the compile-time history) needs no Redis."""
    stats = StoreStats("node-a", tmp_path / "state")
    stats.backend = store
    stats.count("corrupt_rejected", 2, fp="f" * 64)
    assert stats.flush()
    stats.count("corrupt_rejected", 1, fp="f" * 64)
    assert stats.flush()
    assert read_fp_counts(store, ["f" * 64], ["node-a"]) == {"f" * 64: {"corrupt_rejected": 3}}
    store.put(layout.fp_stats_key("f" * 64), b'{"corrupt_rejected": 4}')  # older warmd's
    assert read_fp_counts(store, ["f" * 64], ["node-a"]) == {"f" * 64: {"corrupt_rejected": 7}}
    assert read_counts(store.get(layout.node_stats_key("node-a")))["corrupt_rejected"] == 3
    assert read_nodes(store.get(layout.NODES_KEY)) == ["node-a"]
    assert stats.store_id is not None
    assert history.write(store, {"lib/k": (2, 10.0)}) and history.write(store, {"lib/k": (1, 2.0)})
    assert history.read(store, ["lib/k", "lib/none"]) == {"lib/k": 4.0}


def test_name_indexes_from_threads_lose_no_name_and_keep_the_newest(make):
    stores = [make() for _ in range(4)]
    start = threading.Barrier(len(stores))
    added: list[str] = []  # (an add that lost every round says so: False, not counted)

    def add(i: int) -> None:
        start.wait()
        for n in range(10):
            if json_values.add_names(stores[i], "index", {f"n{i}.{n}": 100.0 * i + n},
                                     keep=1000, ttl_ms=60_000):
                added.append(f"n{i}.{n}")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    index = json_values.read_index(stores[0].get("index"))
    assert set(index) == set(added) and len(added) >= 10
    assert 0 < stores[0].ttl_ms("index") <= 60_000
    assert json_values.add_names(stores[0], "index", {"late": 1000.0}, keep=3)
    assert json_values.oldest_first(json_values.read_index(stores[0].get("index"))) == [
        *sorted(added, key=lambda n: index[n])[-2:], "late"]


def test_counters_from_threads_give_every_arrival_its_own_count(make):
    stores = [make() for _ in range(8)]
    start = threading.Barrier(len(stores))
    counts: list[int | None] = []

    def arrive(store: KeyValueBackend) -> None:
        start.wait()
        counts.append(store.increment("arrivals", 60_000))

    threads = [threading.Thread(target=arrive, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(counts) == list(range(1, 9)) and stores[0].get("arrivals") == b"8"
    assert 0 < stores[0].ttl_ms("arrivals") <= 60_000
    for planted in (b"not a count", b"9" * 40):  # not a count: nothing counted, left as is
        stores[0].put("arrivals", planted)
        assert stores[0].increment("arrivals") is None
        assert stores[0].get("arrivals") == planted
    stores[0].put("arrivals", b"-100")  # a count, if not one warmd would make
    assert stores[0].increment("arrivals") == -99


def test_a_name_index_left_empty_is_deleted_and_one_that_is_no_index_is_replaced(store):
    store.put("index", b"not an index")
    assert json_values.read_index(store.get("index")) == {}
    assert json_values.remove_names(store, "index", ["a"])
    assert store.get("index") == b"not an index"  # nothing to remove: nothing written
    assert json_values.add_names(store, "index", {"a": 2.0, "b": 1.0}, keep=10)
    assert json_values.oldest_first(json_values.read_index(store.get("index"))) == ["b", "a"]
    assert json_values.add_names(store, "index", {"b": 3.0}, keep=10, refresh=False)
    assert json_values.read_index(store.get("index")) == {"a": 2.0, "b": 1.0}  # listed: kept
    assert json_values.remove_names(store, "index", ["a", "b"])
    assert store.get("index") is None


def test_node_records_work_on_any_backend(make):
    """The daemon's node records (warmd.store.nodes) need no Redis: records per namespace,
    each with its TTL, nodes listed once whoever writes, the controller's summary."""
    from store_contract import Node

    backend = make()
    one, other = (StoreNodeRecords(backend, "store", ns, ttl=30) for ns in ("ns1", "ns2"))
    again = StoreNodeRecords(make(), "store", "ns1", ttl=30)  # another process, same list
    assert one.put(Node("a")) and again.put(Node("b", "PENDING")) and one.put(Node("a"))
    assert other.put(Node("c"))
    assert sorted((r["node_id"], r["state"]) for r in again.get_all()) == [
        ("a", "READY"), ("b", "PENDING")]
    assert 0 < backend.ttl_ms(layout.node_key("ns1", "a")) <= 30_000
    assert one.delete("b") and [r["node_id"] for r in again.get_all()] == ["a"]
    assert [r["node_id"] for r in other.get_all()] == ["c"]
    assert one.put_daemon({"config_hash": "abc"}) and again.get_daemon() == {
        "config_hash": "abc"}
    assert one.ping() and one.healthy and one.server_size() is None  # (no measure given)
    assert one.delete_daemon() and one.get_daemon() is None and one.errors == 0


def test_a_redis_backend_whose_server_stopped_fails_as_down(tmp_path):
    srv = start_test_server(tmp_path)
    store = redis_backend(srv.url, join_budget=0.3)
    try:
        assert store.put("k", b"v")
        srv.stop()
        with pytest.raises(StoreFailed) as failed:
            store.get("k")
        assert failed.value.kind == "down"
    finally:
        store.close()
        srv.stop()


def test_a_redis_backend_never_reads_a_key_of_another_type_as_a_value(server):
    client = server.client()
    client.flushall()
    client.hset("planted", mapping={"field": "value"})
    store = redis_backend(server.url)
    try:
        assert store.get_many(["planted", "absent"]) == [None, None]
        assert store.get_prefixes([("planted", 5)]) == [b""]
        assert store.put("planted", b"v", if_absent=True) is False
        assert store.compare_and_set("planted", None, b"v") is False
        assert store.compare_and_set("planted", b"", b"v") is False
        assert store.compare_and_set("planted", b"value", None) is False
        assert client.type("planted") == b"hash"
        assert store.ttl_ms("planted") == NO_EXPIRY
        assert list(store.scan("plant")) == ["planted"]
        assert store.delete(["planted"]) == 1
        assert store.put("planted", b"v", if_absent=True) is True
        client.delete("planted")
        client.rpush("planted", "x")
        assert store.put("planted", b"w") is True  # a plain put replaces it
        assert store.get("planted") == b"w"
    finally:
        store.close()


def test_a_name_index_at_a_key_of_another_type_is_never_replaced(server):
    client = server.client()
    client.flushall()
    client.zadd("index", {"planted": 1.0})
    store = redis_backend(server.url)
    try:
        assert json_values.add_names(store, "index", {"a": 1.0}, keep=10) is False
        assert json_values.remove_names(store, "index", ["planted"]) is True  # none to read
        assert client.type("index") == b"zset"
    finally:
        store.close()


def test_a_disabled_transport_fails_every_call_as_disabled():
    store = RedisBackend(RedisTransport(None, connect_timeout=1.0, socket_timeout=1.0,
                                        breaker=None, disabled_reason="no store configured",
                                        count=lambda _name: None))
    with pytest.raises(StoreFailed) as failed:
        store.get("k")
    assert failed.value.kind == "disabled"


def test_a_sqlite_backend_fails_typed_on_a_file_that_is_not_a_store_and_once_closed(tmp_path):
    path = tmp_path / "store.db"
    path.write_bytes(b"not a database" * 100)
    store = SqliteBackend(path)
    with pytest.raises(StoreFailed) as failed:
        store.get("k")
    assert failed.value.kind == "error"
    store.close()
    with pytest.raises(StoreFailed) as closed:
        store.get("k")
    assert closed.value.kind == "disabled"


def test_sqlite_urls_name_an_absolute_file():
    assert str(sqlite_path("sqlite:///var/lib/warmd/store.db")) == "/var/lib/warmd/store.db"
    for bad in ("sqlite://host/x.db", "sqlite://", "redis://h:1/0", "sqlite:///x.db?mode=ro"):
        with pytest.raises(WarmdInputError):
            sqlite_path(bad)
