"""The store contract (tests/store_contract.py) run against the Redis backend, on a real
redis-server. A new backend adds a class like TestRedisBackend with its own `backend`."""

from __future__ import annotations

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
