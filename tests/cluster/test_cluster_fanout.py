"""Fan-out between nodes (warmd.cluster.fanout): the directory's decisions without Ray, then
real Ray nodes joining one after another, a real redis-server behind them: later nodes take
the blobs from the nodes before them, and a peer serving flipped bytes is refused."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from cluster_support import ray_head_ports
from store_support import SRC, DirAdapter, start_test_server, warmup_plan

from warmd.cluster.fanout import (
    CLAIM_SECONDS,
    MAX_HOLDERS,
    PULL_WINDOW,
    PULLERS_PER_HOLDER,
    PeerDirectory,
)


def test_one_node_reads_a_blob_from_the_store_while_the_others_wait_for_it():
    now = [0.0]
    directory = PeerDirectory(clock=lambda: now[0])
    assert directory.lookup("a", ["d1", "d2"]) == {"d1": ("store",), "d2": ("store",)}
    assert directory.lookup("b", ["d1"]) == {"d1": ("later",)}
    assert directory.lookup("a", ["d1"]) == {"d1": ("store",)}  # still a's to read
    directory.offer("a", {"d1": ["ref-a1"]})
    assert directory.lookup("b", ["d1", "d2"]) == {"d1": ("peer", "a", ["ref-a1"]),
                                                   "d2": ("later",)}
    now[0] += CLAIM_SECONDS + 1  # a never offered d2 (it died, or the store failed it)
    assert directory.lookup("b", ["d2"]) == {"d2": ("store",)}


def test_a_holder_serves_a_few_nodes_at_a_time_the_others_wait_for_them():
    now = [0.0]
    directory = PeerDirectory(clock=lambda: now[0])
    directory.offer("first", {"d": ["r0"]})
    answers = [directory.lookup(f"n{i}", ["d"])["d"] for i in range(PULLERS_PER_HOLDER + 2)]
    assert [a[0] for a in answers] == ["peer"] * PULLERS_PER_HOLDER + ["later"] * 2
    assert directory.lookup("n0", ["d"])["d"][0] == "peer"  # one it serves already
    directory.offer("n0", {"d": ["r1"]})  # a node served holds the blob: it serves next
    assert directory.lookup(f"n{PULLERS_PER_HOLDER}", ["d"])["d"][:2] == ("peer", "n0")
    for i in range(1, PULLERS_PER_HOLDER):  # the first wave is done: first is free again
        directory.offer(f"n{i}", {"d": [f"r{i}"]})
    assert directory.lookup("late", ["d"])["d"][0] == "peer"
    now[0] += PULL_WINDOW + 1  # a puller that never offers frees its slot in time
    directory.forget("n0")
    assert directory.lookup(f"n{PULLERS_PER_HOLDER + 1}", ["d"])["d"][0] == "peer"


def test_holders_share_the_load_and_a_refused_or_gone_holder_is_dropped():
    directory = PeerDirectory()
    directory.offer("a", {"d": ["ra"]})
    directory.offer("b", {"d": ["rb"]})
    served = [directory.lookup(f"n{i}", ["d"])["d"][1] for i in range(6)]
    assert sorted(served) == ["a"] * 3 + ["b"] * 3
    assert directory.lookup("a", ["d"])["d"][1] == "b"  # never sent to itself
    directory.offer("a", {"e": ["ra-e"]})
    directory.refused("n9", "d", "a")  # a served bytes that did not verify
    assert {directory.lookup(f"m{i}", ["d"])["d"][1] for i in range(3)} == {"b"}
    assert directory.lookup("m5", ["e"]) == {"e": ("store",)}  # nothing of a's is handed out
    assert directory.offer("a", {"f": ["ra-f"]}) == 0  # nor anything it offers later
    directory.refused("m6", "d", "b", lost=True)  # b's copy could not be pulled: that one goes
    assert directory.lookup("m9", ["d"]) == {"d": ("store",)}
    directory.offer("b", {"d": ["rb2"]})  # b itself is not distrusted
    assert directory.lookup("m8", ["d"])["d"][1] == "b"
    for i in range(MAX_HOLDERS + 5):
        directory.offer(f"h{i}", {"x": [i]})
    assert len(set(directory.snapshot()["holders"]) - {"b"}) == MAX_HOLDERS


class Joiner:
    """One node's join (open_shared_cache + run_warmup into its own root), with the node's
    peer client: what an agent does."""

    def __init__(self, url: str, root: str, node: str, plan: dict) -> None:
        from testlib import LIBRARY_MODULE

        from warmd import libraries
        from warmd.cluster.fanout import join_peers

        os.environ["WARMD_LIBRARY_PACKAGES"] = LIBRARY_MODULE
        libraries.register(LIBRARY_MODULE)
        self.url, self.root, self.node, self.plan = url, Path(root), node, plan
        self.peers = join_peers(node)

    def join(self) -> dict:
        from testlib import NAME

        from warmd.cache.records import entry_digest
        from warmd.store import open_shared_cache
        from warmd.warmup import WarmupOptions, run_warmup

        options = WarmupOptions(workers=1, gpu_ids=(), cache_roots={NAME: self.root})
        with open_shared_cache(self.url, node=self.node, peers=self.peers) as cache:
            report = run_warmup(warmup_plan(self.plan, size=50_000), options, shared=cache)
            counters = dict(cache.stats.counters)
        return {"kernels": report.counters.kernel_counts(), "failed": len(report.failed),
                "counters": counters,
                "installed": {e.name: entry_digest(e.path)
                              for e in DirAdapter(self.root).list_entries()}}

    def lie(self, blobs: dict[str, bytes]) -> None:
        self.peers.offer({d: b[:-1] + bytes([b[-1] ^ 1]) for d, b in blobs.items()})


@pytest.mark.slow
def test_later_nodes_take_blobs_from_earlier_ones_and_refuse_flipped_bytes(tmp_path,
                                                                            monkeypatch):
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from store_support import registered_testlib, warm

    from warmd.cluster import RAY_NAMESPACE
    from warmd.store import open_shared_cache

    plan = {f"testlib/fan/{t}": [f"kernel.fan{t}_{i}.{t:04x}{i:04x}" for i in range(3)]
            for t in range(4)}
    server = start_test_server(tmp_path)
    publisher = DirAdapter(tmp_path / "publisher")
    with open_shared_cache(server.url, node="publisher") as cache:
        assert warm(cache, publisher, plan, size=50_000)["compiled"] == 12
    with registered_testlib():
        packed = {e.name: publisher.pack(e) for e in publisher.list_entries()}
    published = {e.name: _digest(e.path) for e in publisher.list_entries()}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([SRC, str(Path(SRC) / "tests"),
                                                   str(Path(__file__).parent)]))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 << 20, **ray_head_ports()})
    try:
        ray.init(address=cluster.address, namespace=RAY_NAMESPACE, log_to_driver=False)
        actor = ray.remote(num_cpus=0)(Joiner)

        def node(name: str):
            added = cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
            cluster.wait_for_nodes()
            return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                added.node_id, soft=False)).remote(server.url, str(tmp_path / name), name,
                                                   plan)

        client = server.client()
        sent = lambda: int(client.info("stats")["total_net_output_bytes"])  # noqa: E731
        first_node = node("first")  # (kept: its actor owns the blobs it serves)
        first = ray.get(first_node.join.remote(), timeout=300)
        assert first["kernels"]["remote_hits"] == 12 and first["installed"] == published
        assert "peer_hits" not in first["counters"]  # nobody to ask yet: all from Redis
        second = node("second")
        ray.get(second.__ray_ready__.remote(), timeout=300)
        before = sent()
        got = ray.get(second.join.remote(), timeout=300)
        assert got["kernels"] == {"total": 12, "local_hits": 0, "remote_hits": 12,
                                  "compiled": 0, "failed": 0}
        assert got["counters"]["peer_hits"] == 12 and got["installed"] == published
        assert sent() - before < 0.05 * sum(len(b) for b in packed.values())

        liar = node("liar")
        ray.get(liar.lie.remote({hashlib.sha256(b).hexdigest(): b
                                 for b in packed.values()}), timeout=120)
        third = node("third")
        ray.get(third.__ray_ready__.remote(), timeout=300)
        got = ray.get(third.join.remote(), timeout=300)
        assert got["kernels"]["compiled"] == 0 and got["failed"] == 0
        assert got["counters"]["peer_refused"] >= 1  # asked the liar first, refused it
        assert got["installed"] == published
        assert "quarantined" not in got["counters"]  # a peer's bytes never move entries
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
        server.stop()


def _digest(path: Path) -> str | None:
    from warmd.cache.records import entry_digest

    return entry_digest(path)
