"""Leases, claims on units of cluster work and the renewal of what a plan used, over the
narrow store interface, on Redis and on SQLite: they need no Redis, and without notices (no
pub/sub) waiters find what changed by polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from store_support import module_server

from warmd.coordination import ClaimState, WorkKind
from warmd.store import layout
from warmd.store.backend import KeyValueBackend
from warmd.store.breaker import JoinBudget
from warmd.store.connection import parse_store_url
from warmd.store.counters import StoreStats
from warmd.store.leases import Leases, WorkClaims
from warmd.store.redis_backend import RedisBackend
from warmd.store.renewal import Renewal, Used
from warmd.store.session import Session, StaleRecords
from warmd.store.sqlite_backend import SqliteBackend
from warmd.store.transport import RedisTransport
from warmd.store.wakeups import WakeUps

server = module_server()
FP = "f" * 64


def _transport(url: str) -> RedisTransport:
    return RedisTransport(parse_store_url(url), connect_timeout=1.0,
                          socket_timeout=2.0, breaker=None, disabled_reason=None,
                          count=lambda _name: None, budget=JoinBudget(5.0))


@pytest.fixture(params=["redis", "sqlite"])
def make(request, tmp_path) -> Iterator[Callable[..., KeyValueBackend]]:
    """A maker of backends over one empty store (each call another connection to it); a
    SQLite one may be of a subclass."""
    made: list[KeyValueBackend] = []
    if request.param == "redis":
        srv = request.getfixturevalue("server")
        srv.client().flushall()

    def make(sqlite: type[SqliteBackend] = SqliteBackend) -> KeyValueBackend:
        if request.param == "redis":
            made.append(RedisBackend(_transport(srv.url), what="lease"))
        else:
            made.append(sqlite(tmp_path / "store.db"))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def _session(node: str, backend: KeyValueBackend, tmp_path, lease_ms: int = 5000) -> Session:
    """A node's session over backend."""
    return Session(backend, StoreStats(node, tmp_path / node), node, None,
                   None, ttl_ms=3_600_000, lease_ms=lease_ms, poll_interval=0.05,
                   max_artifact_bytes=1 << 20, namespace="test")


def _claims(node: str, backend: KeyValueBackend, tmp_path, lease_ms: int = 5000
            ) -> WorkClaims:
    return WorkClaims(_session(node, backend, tmp_path), backend, StaleRecords(), WakeUps(),
                      lease_ms)


def test_a_claim_is_held_until_released_then_free(make, tmp_path):
    one, two = _claims("one", make(), tmp_path), _claims("two", make(), tmp_path)
    assert one.claim(FP, "kernel.u.0001", WorkKind.ENTRY).state is ClaimState.MINE
    held = two.claim(FP, "kernel.u.0001", WorkKind.ENTRY)
    assert held.state is ClaimState.HELD and held.holder.startswith("one:")
    one.release(FP, "kernel.u.0001", WorkKind.ENTRY)
    assert two.claim(FP, "kernel.u.0001", WorkKind.ENTRY).state is ClaimState.MINE
    one.close()
    two.close()


def test_a_held_claim_outlives_its_ttl_while_renewed(make, tmp_path):
    one = _claims("one", make(), tmp_path, lease_ms=300)
    two = _claims("two", make(), tmp_path, lease_ms=300)
    assert one.claim(FP, "kernel.r.0001", WorkKind.ENTRY).state is ClaimState.MINE
    time.sleep(1.0)  # three TTLs
    assert two.claim(FP, "kernel.r.0001", WorkKind.ENTRY).state is ClaimState.HELD
    one.close()  # renewing stops: free within the TTL
    time.sleep(0.6)
    assert two.claim(FP, "kernel.r.0001", WorkKind.ENTRY).state is ClaimState.MINE
    assert "lease_lost" not in one.session.stats.counters
    two.close()


def test_a_claim_planted_without_a_ttl_is_taken_over(make, tmp_path):
    store = make()
    lease = layout.kernel_lease_key(FP, "kernel.p.0001")
    store.put(lease, f"c1|mallory|4242|{int(time.time() * 1000)}|0123456789ab".encode())
    claims = _claims("victim", make(), tmp_path)
    assert claims.claim(FP, "kernel.p.0001", WorkKind.ENTRY).state is ClaimState.MINE
    assert claims.session.stats.counters["claims_taken_over"] == 1
    assert store.get(lease).startswith(b"c1|victim|")
    assert 0 < store.ttl_ms(lease) <= 5000
    claims.release(FP, "kernel.p.0001", WorkKind.ENTRY)
    assert store.get(lease) is None
    claims.close()


class PublishedJustBeforeTheTake(SqliteBackend):
    """A store where the unit's holder publishes and releases between a claimer's look at
    the marker and its taking of the lease."""

    def put(self, key: str, value: bytes, ttl_ms: int | None = None, *,
            if_absent: bool = False) -> bool:
        if if_absent and key.startswith(layout.PREFIX + "klease:"):
            super().put(layout.manifest_key(FP, key.rsplit(":", 1)[1]), b"manifest")
        return super().put(key, value, ttl_ms, if_absent=if_absent)


def test_a_lease_taken_as_its_unit_was_published_goes_back(tmp_path):
    store = PublishedJustBeforeTheTake(tmp_path / "store.db")
    claims = _claims("late", store, tmp_path)
    assert claims.claim(FP, "kernel.d.0001", WorkKind.ENTRY).state is ClaimState.PUBLISHED
    assert store.get(layout.kernel_lease_key(FP, "kernel.d.0001")) is None
    assert claims.session.stats.counters["published_meanwhile"] == 1
    claims.close()
    store.close()


def test_a_single_flight_waiter_without_notices_finds_the_publication(make, tmp_path):
    """No pub/sub (WakeUps' waits are sleeps): the waiter polls, and is answered by the
    holder's task record."""
    holder_store = make()
    waiter_store = make()
    holder = Leases(_session("holder", holder_store, tmp_path), holder_store, StaleRecords(),
                    WakeUps())
    waiter = Leases(_session("waiter", waiter_store, tmp_path), waiter_store, StaleRecords(),
                    WakeUps())
    seen: dict[str, object] = {}

    def wait() -> None:
        with waiter.single_flight("testlib/sf", 20) as mine:
            seen["mine"] = mine

    with holder.single_flight("testlib/sf", 20) as mine:
        assert mine
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        assert "mine" not in seen  # still waiting for the holder
        holder_store.put(layout.task_key("-", "testlib/sf"), b"record")
    thread.join(10)
    assert seen["mine"] is False
    assert waiter.session.stats.counters["lease_waits_satisfied"] == 1
    assert holder_store.get(layout.lease_key("-", "testlib/sf")) is None


def test_what_a_plan_used_is_renewed_by_one_node_per_interval(make, tmp_path):
    store = make()
    manifest = layout.manifest_key(FP, "kernel.a.0001")
    store.put(manifest, b"manifest", 5000)
    store.put(layout.used_key(FP, "kernel.a.0001"), b"1.000")
    used = Used(FP)
    used.add_manifests({"kernel.a.0001": (), "kernel.unindexed.0001": ()})
    Renewal(_session("first", store, tmp_path)).renew(used, ["testlib/t"])
    assert store.ttl_ms(manifest) > 3_000_000
    assert float(store.get(layout.used_key(FP, "kernel.a.0001"))) > time.time() - 60
    assert store.get(layout.used_key(FP, "kernel.unindexed.0001")) is None  # never added
    store.expire(manifest, 5000)
    second = make()
    Renewal(_session("second", second, tmp_path)).renew(used, ["testlib/t"])
    assert store.ttl_ms(manifest) <= 5000  # within the interval: nobody renews again
