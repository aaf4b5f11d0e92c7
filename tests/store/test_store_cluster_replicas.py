"""A real Redis Cluster (3 masters, 3 replicas, loopback) with replica reads on: what a
lagging replica answers as absent or broken is asked again of the primary, so entries
published while nodes join are installed, never compiled again and never quarantined."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from store_support import DirAdapter, start_test_server, warm

from warmd.store import layout, open_shared_cache

pytestmark = pytest.mark.slow

PASSWORD = "cl-pw"
SIZE = 30_000


def plan_of(tasks: range, per_task: int = 3) -> dict[str, list[str]]:
    return {f"testlib/rep/{t}": [f"kernel.r{t}_{i}.{t:04x}{i:04x}" for i in range(per_task)]
            for t in tasks}


class RedisCluster:
    """Six redis-server processes in cluster mode joined by `redis-cli --cluster create`."""

    def __init__(self, base: Path) -> None:
        self.servers = [start_test_server(base / f"n{i}", password=PASSWORD, config={
            "cluster-enabled": "yes", "cluster-config-file": str(base / f"n{i}.conf"),
            "masterauth": PASSWORD, "cluster-node-timeout": "5000"}) for i in range(6)]
        subprocess.run(["redis-cli", "-a", PASSWORD, "--no-auth-warning", "--cluster",
                        "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        self.clients = [s.client() for s in self.servers]
        deadline = time.monotonic() + 30
        while not all(self._ready(c) for c in self.clients):
            assert time.monotonic() < deadline, "the cluster did not settle"
            time.sleep(0.1)

    @staticmethod
    def _ready(client) -> bool:
        if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            return False
        info = client.info("replication")
        if info["role"] != "master" and info.get("master_link_status") != "up":
            return False
        # every shard's replica announced (what a client learns replicas from)
        return all(len(shard) >= 4 for shard in client.execute_command("CLUSTER", "SLOTS"))

    def url(self, query: str = "") -> str:
        return f"redis+cluster://:{PASSWORD}@127.0.0.1:{self.servers[0].port}{query}"

    def replicas(self) -> list:
        return [c for c in self.clients if c.info("replication")["role"] == "slave"]

    def replica_of_slot(self, slot: int):
        """The replica whose master serves slot (from CLUSTER NODES)."""
        lines = [line.split() for line in self.clients[0].execute_command(
            "CLUSTER", "NODES").decode().splitlines() if line] \
            if isinstance(self.clients[0].execute_command("CLUSTER", "NODES"), bytes) else None
        if lines is None:  # redis-py parsed it: {address: {...}}
            nodes = self.clients[0].execute_command("CLUSTER", "NODES")
            masters = {info["node_id"]: info for info in nodes.values()
                       if "master" in info["flags"]}
            owner = next(i for i, info in masters.items()
                         if any(int(r[0]) <= slot <= int(r[-1]) for r in info["slots"]))
            port = next(int(addr.split(":")[1].split("@")[0]) for addr, info in nodes.items()
                        if info.get("master_id") == owner)
        else:
            owner = next(f[0] for f in lines if "master" in f[2] and any(
                int(r.split("-")[0]) <= slot <= int(r.split("-")[-1]) for r in f[8:]))
            port = next(int(f[1].split(":")[1].split("@")[0]) for f in lines if f[3] == owner)
        return next(c for s, c in zip(self.servers, self.clients, strict=True)
                    if s.port == port)

    def cut(self, replica) -> None:
        """The replica stops following its master (it cannot log in again): it lags."""
        replica.config_set("masterauth", "wrong")
        replica.execute_command("CLIENT", "KILL", "TYPE", "master")

    def mend(self) -> None:
        for client in self.replicas():
            client.config_set("masterauth", PASSWORD)

    def reads_on_replicas(self) -> int:
        return sum(int(v["calls"]) for c in self.replicas()
                   for k, v in c.info("commandstats").items()
                   if k in ("cmdstat_get", "cmdstat_getrange"))

    def quarantined(self) -> list:
        return [k for c in self.clients if c.info("replication")["role"] == "master"
                for k in c.scan_iter(match=layout.PREFIX + "quar:*")]

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    found = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield found
    found.stop()


def test_a_lagging_replica_never_quarantines_nor_compiles(cluster, tmp_path):
    """The replicas of the shards holding the blobs stop following their masters; a plan is
    published; a node reading only from replicas finds the manifests there but not the
    chunks: it asks the primaries again and installs everything."""
    writer = open_shared_cache(cluster.url(), node="writer")
    reader_url = cluster.url("?load_balancing_strategy=round_robin_replicas")
    plan = plan_of(range(4))
    fp = writer.fingerprint(DirAdapter(tmp_path / "w")).digest
    fp_slot = writer.op(lambda c: c.keyslot(layout.index_key(fp)), "test")
    keeper = cluster.replica_of_slot(fp_slot)
    cut = [replica for replica in cluster.replicas() if replica is not keeper]
    for replica in cut:
        cluster.cut(replica)
    try:
        sizes = [r.dbsize() for r in cut]
        assert warm(writer, DirAdapter(tmp_path / "w"), plan, size=SIZE)["compiled"] == 12
        time.sleep(0.5)  # the manifests' replica follows; the others do not
        assert [r.dbsize() for r in cut] == sizes  # they lag: the new chunks are not there
        before = cluster.reads_on_replicas()
        reader = open_shared_cache(reader_url, node="reader")
        counts = warm(reader, DirAdapter(tmp_path / "r"), plan, size=SIZE)
        assert counts == {"local_hits": 0, "remote_hits": 12, "compiled": 0}
        assert cluster.reads_on_replicas() > before  # replicas did answer reads
        counters = reader.stats.counters
        assert "corrupt_rejected" not in counters and "quarantined" not in counters
        assert cluster.quarantined() == []
        reader.close()
    finally:
        cluster.mend()
        writer.close()


def test_entries_published_while_nodes_join_are_never_quarantined(cluster, tmp_path):
    """A writer publishes task after task while nodes with replica reads join over and
    over: every join installs what it finds or compiles what is not published yet; no
    valid entry is ever refused or quarantined."""
    reader_url = cluster.url("?read_from_replicas=true")
    writer = open_shared_cache(cluster.url(), node="writer2")
    stop = threading.Event()
    published: list[str] = []

    def publish() -> None:
        for t in range(100, 130):
            if stop.is_set():
                return
            plan = plan_of(range(t, t + 1))
            warm(writer, DirAdapter(tmp_path / "pub"), plan, size=SIZE)
            published.append(f"testlib/rep/{t}")

    thread = threading.Thread(target=publish)
    thread.start()
    joins = []
    try:
        while thread.is_alive() and len(joins) < 12:
            reader = open_shared_cache(reader_url, node=f"j{len(joins)}")
            ready = list(published)
            counts = warm(reader, DirAdapter(tmp_path / f"j{len(joins)}"), plan_of(
                int(k.rsplit("/", 1)[1]) for k in ready), size=SIZE) if ready else {}
            joins.append((counts, dict(reader.stats.counters)))
            reader.close()
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert len(joins) >= 3
    for counts, counters in joins:
        # what was published before the join began is installed, never compiled again
        assert not counts or counts["compiled"] == 0, (counts, counters)
        assert "corrupt_rejected" not in counters and "quarantined" not in counters
    assert cluster.quarantined() == []
