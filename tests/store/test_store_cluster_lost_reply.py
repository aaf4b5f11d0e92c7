"""A put if absent whose reply is lost, on a real Redis Cluster (3 masters, loopback): the
command lands, and the reply never reaches the client. The loss is injected into redis-py's
connection (its read of the SET NX's reply raises a timeout once, after reading it): no
server can be made to drop a reply on its own. Sent again, the put would answer "already
there" for the node's own value, and a claimer would wait out its own lease; it fails as
the store being down instead."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis
import redis.connection
from store_support import start_test_server

from warmd.store.api import StoreFailed
from warmd.store.connection import parse_store_url
from warmd.store.redis_backend import open_redis

pytestmark = pytest.mark.slow

PASSWORD = "lost-pw"


@pytest.fixture
def cluster_url(tmp_path):
    servers = [start_test_server(tmp_path / f"n{i}", password=PASSWORD, config={
        "cluster-enabled": "yes", "cluster-config-file": str(tmp_path / f"n{i}.conf"),
        "cluster-node-timeout": "5000"}) for i in range(3)]
    try:
        subprocess.run(["redis-cli", "-a", PASSWORD, "--no-auth-warning", "--cluster", "create",
                        *(f"127.0.0.1:{s.port}" for s in servers), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        clients = [s.client() for s in servers]
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
                      for c in clients):
            assert time.monotonic() < deadline, "the cluster did not settle"
            time.sleep(0.1)
        yield f"redis+cluster://:{PASSWORD}@127.0.0.1:{servers[0].port}"
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def set_nx_reply_lost_once(monkeypatch):
    """redis-py's connections lose the reply to the next SET ... NX, once, after reading it
    (sent alone or in a pipeline)."""
    connection = redis.connection.AbstractConnection
    send, packs, read = connection.send_command, connection.pack_commands, connection.read_response
    armed = {"set_nx": False, "lost": 0}

    def note(args) -> None:
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        if words and words[0].upper() == "SET" and "NX" in (w.upper() for w in words) \
                and not armed["lost"]:
            armed["set_nx"] = True

    def send_command(self, *args, **kwargs):
        note(args)
        return send(self, *args, **kwargs)

    def pack_commands(self, commands):
        for args in commands:
            note(args)
        return packs(self, commands)

    def read_response(self, *args, **kwargs):
        reply = read(self, *args, **kwargs)
        if armed["set_nx"]:
            armed["set_nx"] = False
            armed["lost"] += 1
            raise redis.exceptions.TimeoutError("Timeout reading from socket (injected)")
        return reply

    monkeypatch.setattr(connection, "send_command", send_command)
    monkeypatch.setattr(connection, "pack_commands", pack_commands)
    monkeypatch.setattr(connection, "read_response", read_response)
    return armed


def test_a_put_if_absent_whose_reply_is_lost_fails_and_never_reads_as_refused(
        cluster_url, set_nx_reply_lost_once):
    store = open_redis(parse_store_url(cluster_url), count=lambda _name: None,
                       connect_timeout=2.0, socket_timeout=2.0, join_budget=2.0)
    key = "warmd:v1:klease:{fp}:kernel.lost.0001"
    try:
        store.main.put("warmd:v1:warm-up", b"x")  # connected, the slots learnt
        with pytest.raises(StoreFailed) as failed:
            store.claims.put(key, b"mine", 30_000, if_absent=True)
        assert failed.value.kind == "down" and set_nx_reply_lost_once["lost"] == 1
        direct = redis.RedisCluster.from_url(cluster_url.replace("redis+cluster", "redis"))
        assert direct.get(key) == b"mine"  # it landed: a second send would say "there"
        direct.close()
    finally:
        store.main.close()
