"""A shared cache over SQLite (sqlite:///path, warmd.store.sqlite_backend) is a whole store:
warmd's real warmup through it publishes on a cold node and installs on the next, signed;
`warmd warmup --redis sqlite:///...` does the same from the command line; a URL or a file
that cannot be used is bad input, said in one line; and what only Redis has (the operator
commands' raw reads and writes) says so instead of failing obscurely."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, compiles, registered_testlib, task_entries, warm, warmup_plan
from testlib import ROOT_ENV

from warmd.cli import main
from warmd.errors import WarmdInputError
from warmd.plan import Plan
from warmd.store import StoreFailed, open_node_records, open_shared_cache, sqlite_backend
from warmd.store.backend import Put

KEY = b"sqlite-test-signing-key-0123456789"


def test_a_warmup_over_sqlite_publishes_once_and_installs_on_another_node(tmp_path, caches):
    url, log = f"sqlite://{tmp_path}/store.db", tmp_path / "compiles.log"
    plan = task_entries(3)
    cold = caches(url, signing_key=KEY)
    assert warm(cold, DirAdapter(tmp_path / "a"), plan, log) == {
        "local_hits": 0, "remote_hits": 0, "compiled": 6}
    assert cold.stats.counters["published"] == 6
    joining = caches(url, signing_key=KEY)
    assert warm(joining, DirAdapter(tmp_path / "b"), plan, log) == {
        "local_hits": 0, "remote_hits": 6, "compiled": 0}
    assert len(compiles(log)) == 6  # nothing compiled twice
    # signed: a node with another key refuses every entry and builds them itself
    stranger = caches(url, signing_key=b"another-key-0123456789-abcdefghij")
    assert warm(stranger, DirAdapter(tmp_path / "c"), plan, log)["remote_hits"] == 0


def test_a_malformed_sqlite_url_or_an_unwritable_file_is_bad_input(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    for bad in ("sqlite://host/x.db", f"sqlite://{tmp_path}/x.db?mode=ro",
                f"sqlite://{tmp_path}/file/store.db", f"sqlite://{tmp_path}"):
        with pytest.raises(WarmdInputError) as raised:
            open_shared_cache(bad)
        assert "\n" not in str(raised.value)
        with pytest.raises(WarmdInputError):
            open_node_records(bad, "ns")


def test_the_redis_only_operator_reads_say_they_need_redis(tmp_path, caches):
    cache = caches(f"sqlite://{tmp_path}/store.db")
    with pytest.raises(StoreFailed) as failed:
        cache.op(lambda client: client.ping(), "prune")
    assert str(failed.value) == "prune works on a Redis store only"
    assert cache.lists.learned(DirAdapter(tmp_path / "a"), "0" * 16) == []  # a miss, not a failure


def test_warmd_warmup_with_a_sqlite_store_twice_hits_every_entry_the_second_time(
        tmp_path, monkeypatch):
    """The real CLI, its plan the test library's (no model's planner knows it), the library's
    cache under each node's directory (as an engine's cache variable would put it)."""
    url = f"sqlite://{tmp_path}/s.db"

    def warmup(node: str) -> dict:
        def testlib_plan(_request, _environ=None) -> Plan:
            plan = warmup_plan(task_entries(2))
            dirs = plan.dirs()
            return dataclasses.replace(plan, cache_dirs=dataclasses.replace(
                dirs, values=(*dirs.values, (ROOT_ENV, str(tmp_path / node)))))

        monkeypatch.setattr("warmd.cli.warmup.make_plan", testlib_plan)
        monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / node / "state"))
        monkeypatch.setenv("WARMD_NODE_NAME", node)
        result = CliRunner().invoke(main, ["warmup", "-m", "qwen3-30b-a3b-fp8", "-t", "h200",
                                           "--workers", "1", "--redis", url, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    with registered_testlib():
        first, second = warmup("a"), warmup("b")
    assert first["kernels"]["compiled"] == 4 and first["store"]["ok"], first["store"]
    assert second["kernels"] == {"total": 4, "local_hits": 0, "remote_hits": 4,
                                 "compiled": 0, "failed": 0}
    assert second["store"]["url"] == f"sqlite://{tmp_path}/s.db"
    assert sorted(p.name for p in (tmp_path / "b").glob("kernel.*")) == sorted(
        n for names in task_entries(2).values() for n in names)


def test_the_cache_commands_on_a_sqlite_store(tmp_path):
    url = f"sqlite://{tmp_path}/s.db"
    stats = CliRunner().invoke(main, ["cache", "stats", "--json", "--redis", url])
    assert stats.exit_code == 0 and json.loads(stats.stdout)["store"] == url
    prune = CliRunner().invoke(main, ["cache", "prune", "--older-than", "1", "--redis", url])
    assert prune.exit_code == 1
    assert prune.output.strip().endswith("prune works on a Redis store only")
    bad = CliRunner().invoke(main, ["cache", "stats", "--redis", "sqlite://host/s.db"])
    assert bad.exit_code == 2 and "invalid SQLite store URL" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_many_large_puts_are_written_in_transactions_of_bounded_size(tmp_path, monkeypatch):
    """A publication of large artifacts never holds SQLite's write lock for all of them:
    put_many writes at most PUT_BATCH_BYTES of values per transaction, each put as put
    would, answered in order."""
    monkeypatch.setattr(sqlite_backend, "PUT_BATCH_BYTES", 1000)
    store = sqlite_backend.SqliteBackend(tmp_path / "store.db")
    writes: list[int] = []
    transaction = store._transaction

    def counted(what, write=False):
        writes.append(write)
        return transaction(what, write)

    store._transaction = counted
    store.put("held", b"theirs")
    writes.clear()
    puts = [Put("a", b"x" * 600), Put("b", b"y" * 600), Put("held", b"z" * 10, if_absent=True),
            Put("c", b"w" * 2000), Put("d", b"v" * 10)]
    assert store.put_many(puts) == [True, True, False, True, True]
    assert writes == [True] * 4  # [a], [b, held], [c] (larger than a batch: alone), [d]
    assert store.get_many(["a", "b", "held", "c", "d"]) == [
        b"x" * 600, b"y" * 600, b"theirs", b"w" * 2000, b"v" * 10]
    store.close()
