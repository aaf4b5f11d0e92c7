"""Faults are counted where operators look. Counters a store could not
take (paused, full) are kept locally and reach `warmd cache stats` once it is back; one
installed entry is one hit; a node-local refusal is remembered; archives are limited to a
member count that fits real modules."""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from store_support import (
    DirAdapter,
    fp_counts,
    module_server,
    start_test_server,
    task_entries,
    warm,
)

from warmd.cache.base import CacheEntry, IncompatibleHere, UnsafeArtifact
from warmd.cache.install import MAX_MEMBERS, check_artifact
from warmd.cache.packing import pack_members
from warmd.cli import main
from warmd.store import layout

PLAN = task_entries(2, per_task=2)


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _spooled(state: Path) -> list[Path]:
    return sorted((state / "store-stats").glob("*/*.json"))


def _node_totals(url: str, node: str) -> dict:
    result = CliRunner().invoke(main, ["cache", "stats", "--json", "--redis", url])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["nodes"].get(node, {})


def test_counters_of_a_paused_store_reach_cache_stats_when_it_returns(tmp_path, caches, state):
    srv = start_test_server(tmp_path)
    try:
        # a short join budget: the paused store is given up on in 2 s, not the default 60
        cache = caches(srv.url, node="paused", socket_timeout=0.3, join_budget=2.0)
        warm(cache, DirAdapter(tmp_path / "a"), PLAN)  # publishes and flushes: store known
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            assert cache.entries.fetch_task(DirAdapter(tmp_path / "b"), next(iter(PLAN))) is None
            cache.stats.record_outcomes({"compiled": 3})
            cache.close()
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        assert cache.stats.counters["store_errors"] == 1
        assert len(_spooled(state)) == 1  # kept locally, not dropped
        totals = _node_totals(srv.url, "paused")
        assert totals["store_errors"] == 1 and totals["compiled"] == 4 + 3
        assert _spooled(state) == []  # flushed once, never twice
        assert _node_totals(srv.url, "paused")["store_errors"] == 1
    finally:
        srv.stop()


def test_counters_of_a_full_store_are_kept_until_it_has_room(tmp_path, caches, state):
    srv = start_test_server(tmp_path)
    client = srv.client()
    try:
        first = caches(srv.url, node="full")
        warm(first, DirAdapter(tmp_path / "a"), {"testlib/other": ["kernel.other.0001"]})
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        cache = caches(srv.url, node="full")
        counts = warm(cache, DirAdapter(tmp_path / "b"), PLAN)
        # each of the 4 entries as it was built, then the 2 tasks' records
        assert counts["compiled"] == 4 and cache.stats.counters["publish_failed"] == 6
        cache.close()
        assert len(_spooled(state)) == 1
        client.config_set("maxmemory", "0")
        totals = _node_totals(srv.url, "full")
        assert totals["publish_failed"] == 6 and totals["compiled"] == 1 + 4
    finally:
        client.close()
        srv.stop()


server = module_server()


def test_an_installed_entry_is_one_hit(server, rclient, caches, tmp_path):
    writer = caches(server.url, node="w")
    warm(writer, DirAdapter(tmp_path / "a"), PLAN)
    fp = writer.fingerprint(DirAdapter(tmp_path / "a")).digest
    reader = caches(server.url, node="r")
    adapter = DirAdapter(tmp_path / "b")
    reader.entries.prefetch(adapter, list(PLAN))  # what warmup does first, then task by task:
    for task in PLAN:
        assert reader.entries.fetch_task(adapter, task) == PLAN[task]
    assert reader.stats.counters["remote_hits"] == 4 and reader.stats.counters["tasks_hit"] == 2
    assert "local_hits" not in reader.stats.counters
    reader.close()  # its counters flushed
    stats = fp_counts(writer, fp)
    assert stats["remote_hits"] == 4 and stats["tasks_hit"] == 2
    assert "local_hits" not in stats  # the writer had nothing present when it looked


class CountingIncompatibleAdapter(DirAdapter):
    """The test library on a node that cannot use its entries; counts install attempts."""

    installs = 0

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        type(self).installs += 1
        raise IncompatibleHere("built against files missing here")


def test_a_node_local_refusal_is_remembered_for_the_process(server, rclient, caches, tmp_path):
    writer = caches(server.url, node="w")
    warm(writer, DirAdapter(tmp_path / "a"), PLAN)
    # run_warmup installs through the registered test library's own adapter, so this
    # node-local refusal is driven through the session's fetch path directly: every task a
    # miss (warmup then compiles it, as the other tests show), each entry tried once.
    CountingIncompatibleAdapter.installs = 0
    reader = caches(server.url, node="r")
    adapter = CountingIncompatibleAdapter(tmp_path / "b")
    assert all(reader.entries.fetch_task(adapter, task) is None for task in PLAN)
    assert CountingIncompatibleAdapter.installs == 4  # once per entry, not once per look
    assert reader.stats.counters["refused_here"] == 4 and "quarantined" not in reader.stats.counters
    task = next(iter(PLAN))
    fresh = CountingIncompatibleAdapter(tmp_path / "c")
    assert reader.entries.fetch_task(fresh, task) is None
    assert CountingIncompatibleAdapter.installs == 4  # not fetched nor tried again
    assert rclient.exists(layout.manifest_key(writer.fingerprint(adapter).digest, PLAN[task][0]))


def _tar_of(count: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for i in range(count):
            info = tarfile.TarInfo(f"module/f{i}.o")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return raw.getvalue()


def test_member_limit_fits_real_modules_and_refuses_floods(tmp_path):
    # fused_moe_90, FlashInfer's largest sm_90a module: 248 sources -> about 520 members
    assert MAX_MEMBERS >= 4 * 520
    assert len(check_artifact(_tar_of(600))) == 600
    with pytest.raises(UnsafeArtifact, match="members"):
        check_artifact(_tar_of(MAX_MEMBERS + 1))
    source = tmp_path / "f"
    source.write_bytes(b"x")
    with pytest.raises(UnsafeArtifact, match="refusing to pack"):
        pack_members([(f"module/f{i}.o", source) for i in range(MAX_MEMBERS + 1)])
