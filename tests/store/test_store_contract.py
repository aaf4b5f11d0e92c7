"""The store contract (tests/store_contract.py) run against each backend: Redis on a real
redis-server, SQLite on a file of the test's temp dir. A new backend adds a class like
these with its own `backend`."""

from __future__ import annotations

import sqlite3

import pytest
from store_contract import Backend, StoreContract
from store_support import module_server

from warmd.store import free_port, open_node_records

PASSWORD = "contract-pw"


server = module_server(PASSWORD)


class TestRedisBackend(StoreContract):
    @pytest.fixture
    def backend(self, server, rclient, caches) -> Backend:
        down = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
        opened = []

        def records(url: str):
            def make(namespace: str):
                opened.append(open_node_records(url, namespace, ttl=30))
                return opened[-1]
            return make

        yield Backend(open=lambda: caches(server.url, poll_interval=0.1),
                      open_down=lambda: caches(down), open_off=lambda: caches("off"),
                      records=records(server.url), records_down=records(down),
                      secret=PASSWORD)
        for item in opened:
            item.close()


class TestSqliteBackend(StoreContract):
    @pytest.fixture
    def backend(self, tmp_path, caches) -> Backend:
        url, down = f"sqlite://{tmp_path}/store.db", f"sqlite://{tmp_path}/locked.db"
        caches(down).close()  # the file made, then held: busy, a store that does not answer
        holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        opened = []

        def records(url: str):
            def make(namespace: str):
                opened.append(open_node_records(url, namespace, ttl=30, timeout=0.1))
                return opened[-1]
            return make

        yield Backend(open=lambda: caches(url, poll_interval=0.1),
                      open_down=lambda: caches(down, socket_timeout=0.2),
                      open_off=lambda: caches("off"), records=records(url),
                      records_down=records(down), secret="no secret in a file's URL")
        holder.close()
        for item in opened:
            item.close()
