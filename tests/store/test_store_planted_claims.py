"""Claims a Redis writer plants (without the signing key) against a real redis-server: a
claim that does not look like warmd's (no TTL, a TTL longer than warmd sets, a value that
is no holder record, a key of another type, no MAC in a signed cluster) is taken over at
once and counted; one that looks right holds a warmup for at most the single-flight
timeout; and warmd's own claims are still honoured between its nodes."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, module_server, task_entries, warm

from warmd.cli import main
from warmd.coordination import ClaimState
from warmd.store import claimid, layout

server = module_server()
CACHE_DEFAULTS = {"poll_interval": 0.05}
KEY = b"cluster-signing-key"


def _kernel_lease(cache, adapter, name: str) -> str:
    return layout.kernel_lease_key(cache.fingerprint(adapter).digest, name)


def _forged(node: str = "mallory") -> str:
    """A holder record as a keyless writer makes it: the right shape, no MAC."""
    return f"c1|{node}|4242|{int(time.time() * 1000)}|0123456789ab"


PLANTS = {
    "no TTL": lambda c, key: c.set(key, _forged()),
    "a day's TTL": lambda c, key: c.set(key, _forged(), px=86_400_000),
    "not a holder record": lambda c, key: c.set(key, "mallory:1:abc", px=20_000),
    "dated in the future": lambda c, key: c.set(
        key, f"c1|mallory|1|{int(time.time() * 1000) + 86_400_000}|0123456789ab", px=20_000),
    "another Redis type": lambda c, key: c.hset(key, "holder", "mallory"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_foreign_claim_is_taken_over_at_once_and_counted(server, caches, tmp_path, plant):
    client = server.client()
    client.flushall()
    cache = caches(server.url, node="victim")
    adapter = DirAdapter(tmp_path / "a")
    lease = _kernel_lease(cache, adapter, "kernel.p.0001")
    PLANTS[plant](client, lease)
    claim = cache.claims.claim(adapter, "kernel.p.0001")
    assert claim.state == ClaimState.MINE
    assert cache.stats.counters["claims_taken_over"] == 1
    assert client.get(lease).decode().startswith("c1|victim|")  # ours now, with our TTL
    assert 0 < client.pttl(lease) <= claimid.MAX_CLAIM_TTL_MS
    cache.claims.release(adapter, "kernel.p.0001")
    assert client.exists(lease) == 0


def test_a_keyless_writer_s_claim_is_foreign_in_a_signed_cluster(server, caches, tmp_path):
    client = server.client()
    client.flushall()
    signed = caches(server.url, node="signed", signing_key=KEY)
    adapter = DirAdapter(tmp_path / "a")
    lease = _kernel_lease(signed, adapter, "kernel.s.0001")
    client.set(lease, _forged(), px=20_000)  # the right shape and TTL, no MAC
    assert signed.claims.claim(adapter, "kernel.s.0001").state == ClaimState.MINE
    assert signed.stats.counters["claims_taken_over"] == 1
    # a record whose MAC was made for another key (moved here from another claim) is too
    other = _kernel_lease(signed, adapter, "kernel.s.0002")
    client.set(other, claimid.make_record("signed", lease, claimid.claim_key(KEY)),
               px=20_000)
    assert signed.claims.claim(adapter, "kernel.s.0002").state == ClaimState.MINE
    assert signed.stats.counters["claims_taken_over"] == 2


def test_warmd_s_own_claims_are_honoured_signed_or_not(server, caches, tmp_path):
    server.client().flushall()
    for key in (None, KEY):
        one = caches(server.url, node="one", signing_key=key)
        two = caches(server.url, node="two", signing_key=key)
        a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
        name = f"kernel.h{1 if key else 0}.0001"
        assert one.claims.claim(a, name).state == ClaimState.MINE
        held = two.claims.claim(b, name)
        assert held.state == ClaimState.HELD and held.holder.startswith("one:")
        assert two.stats.counters.get("claims_taken_over", 0) == 0
        one.claims.release(a, name)


def _warm_in_thread(cache, adapter, plan, log, timeout: float) -> tuple[threading.Thread, dict]:
    """warm() in a thread, so that a warmup that never ends fails the test, not hangs it."""
    out: dict = {}

    def run():
        began = time.monotonic()
        out["counts"] = warm(cache, adapter, plan, log, timeout=timeout)
        out["seconds"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("plant", ["no TTL", "a day's TTL"])
def test_a_planted_claim_does_not_hold_a_warmup(server, caches, tmp_path, plant):
    """Every kernel of the plan and its task's lease planted before the warmup: it takes
    them over and builds everything, without waiting."""
    client = server.client()
    client.flushall()
    cache = caches(server.url, node="victim")
    adapter = DirAdapter(tmp_path / "a")
    plan = task_entries(2)
    fp = cache.fingerprint(adapter).digest
    for task, names in plan.items():
        PLANTS[plant](client, layout.lease_key(fp, task))
        for name in names:
            PLANTS[plant](client, layout.kernel_lease_key(fp, name))
    thread, out = _warm_in_thread(cache, adapter, plan, tmp_path / "log", timeout=5.0)
    thread.join(120)
    assert not thread.is_alive(), "the warmup is still waiting on the planted claims"
    assert out["counts"]["compiled"] == 4
    assert cache.stats.counters["claims_taken_over"] == 4
    assert cache.stats.counters.get("lease_timeouts", 0) == 0
    cache.close()  # its counters reach the store: `warmd cache stats` shows them
    shown = CliRunner().invoke(main, ["cache", "stats", "--redis", server.url])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"Foreign claims taken over\s+4\b", shown.output), shown.output


def test_a_claim_that_looks_right_holds_a_warmup_no_longer_than_the_timeout(
        server, caches, tmp_path):
    """An unsigned cluster: a writer keeps a well-formed claim alive (renewing its short
    TTL, as a live holder would). The warmup waits the single-flight timeout, then builds
    the kernel itself."""
    client = server.client()
    client.flushall()
    cache = caches(server.url, node="victim")
    adapter = DirAdapter(tmp_path / "a")
    plan = {"testlib/gemm/0": ["kernel.r0.0001"]}
    lease = _kernel_lease(cache, adapter, "kernel.r0.0001")
    stop = threading.Event()

    def keep_alive():
        record = _forged()
        while not stop.is_set():
            client.set(lease, record, px=3000)
            stop.wait(0.5)

    planter = threading.Thread(target=keep_alive, daemon=True)
    planter.start()
    try:
        time.sleep(0.2)
        thread, out = _warm_in_thread(cache, adapter, plan, tmp_path / "log", timeout=3.0)
        thread.join(120)
    finally:
        stop.set()
        planter.join()
    assert not thread.is_alive(), "the warmup is still waiting past the single-flight timeout"
    assert out["counts"]["compiled"] == 1
    assert cache.stats.counters["lease_timeouts"] == 1
    assert cache.stats.counters.get("claims_taken_over", 0) == 0
    assert out["seconds"] >= 3.0  # it did honour the claim for the timeout


def test_names_planted_in_the_pending_index_cannot_hold_real_captures_out(server, caches,
                                                                        tmp_path):
    """The producer reads the oldest pending captures first, a bounded number of them: names
    without a record, planted oldest, are dropped at the first pass, not kept for ever."""
    from warmd.context import NodeContext
    from warmd.rederive import rederive_pending
    from warmd.store.pending import MAX_PENDING_LISTED

    client = server.client()
    client.flushall()
    cache = caches(server.url, node="producer")
    adapter = DirAdapter(tmp_path / "a")
    assert cache.captures.submit(adapter, ["plan"], "kernel.real.0001", b"artifact")
    key = layout.captures_key(cache.fingerprint(adapter).digest)
    index = {f"kernel.fake{i}.0001": 0 for i in range(MAX_PENDING_LISTED)}
    client.set(key, json.dumps({**json.loads(client.get(key)), **index}))
    # held out by the planted names
    assert "kernel.real.0001" not in cache.captures.pending(adapter)
    results = rederive_pending(cache, adapter, NodeContext.of())
    assert sum(r.outcome == "refused" for r in results) == MAX_PENDING_LISTED
    assert cache.captures.pending(adapter) == ["kernel.real.0001"]
