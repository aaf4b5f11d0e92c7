"""Claims on units of cluster work against a real redis-server, between two nodes: a claim
is one node's until released, a published unit is nobody's to build; without a store
every unit is this node's."""

from __future__ import annotations

from store_support import DirAdapter, compile_entry, module_server

from warmd.coordination import ClaimState

server = module_server()


def test_a_unit_claimed_elsewhere_is_held_until_released_then_free(server, caches, tmp_path):
    server.client().flushall()
    one, two = caches(server.url, node="one"), caches(server.url, node="two")
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    assert one.claims.claim(a, "kernel.u.0001").state == ClaimState.MINE
    held = two.claims.claim(b, "kernel.u.0001")
    assert held.state == ClaimState.HELD and held.holder.startswith("one:")
    one.claims.release(a, "kernel.u.0001")
    assert two.claims.claim(b, "kernel.u.0001").state == ClaimState.MINE


def test_a_published_unit_is_nobody_s_to_build(server, caches, tmp_path):
    server.client().flushall()
    one, two = caches(server.url, node="one"), caches(server.url, node="two")
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    assert one.claims.claim(a, "kernel.done.0001").state == ClaimState.MINE
    one.entries.publish_entries(a, [compile_entry(a, "kernel.done.0001")], 1.0)
    one.claims.release(a, "kernel.done.0001")
    assert two.claims.claim(b, "kernel.done.0001").state == ClaimState.PUBLISHED


def test_without_a_store_every_unit_is_this_node_s(caches, tmp_path):
    alone = caches("off")
    adapter = DirAdapter(tmp_path / "a")
    assert alone.claims.claim(adapter, "kernel.x.0001").state == ClaimState.MINE
    assert alone.claims.claim(adapter, "kernel.x.0001").state == ClaimState.MINE
