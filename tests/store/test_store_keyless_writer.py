"""What a writer without the signing key plants in warmd's own lists, against a real
redis-server: keys of another Redis type where the fingerprint list, an index or the stats'
node list live, and a learned index of 500,000 names. Admin commands keep working, every
publication still lands, and a node warming a plan reads a bounded learned index."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, compile_entry, module_server, task_entries, warm

from warmd.capture.sharing import install_learned, learned_task, publish_learned
from warmd.cli import main
from warmd.store import json_values, layout
from warmd.store.formats import StoredTaskRecord, json_bytes

server = module_server("keyless-pw")

CACHE_DEFAULTS = {"poll_interval": 0.05, "lease_seconds": 5.0}
PLAN = task_entries(2, per_task=2, prefix="w")


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "WRONGTYPE" not in result.output
    return result


def retype(rclient, key: str, kind: str) -> None:
    rclient.delete(key)
    if kind == "string":
        rclient.set(key, b"planted")
    elif kind == "list":
        rclient.rpush(key, b"planted")
    else:
        rclient.hset(key, "planted", "1")


# (the stats' node list is a string: a planted string there is a bad value, test_store_redis)
@pytest.mark.parametrize(("which", "kind"), [
    ("fps", "string"), ("fps", "hash"), ("index", "string"), ("index", "hash"),
    ("stats-nodes", "hash"), ("stats-nodes", "list")])
def test_admin_commands_and_publications_survive_keys_of_another_type(
        which, kind, server, rclient, caches, tmp_path):
    writer = caches(server.url, node="writer")
    adapter = DirAdapter(tmp_path / "a")
    warm(writer, adapter, PLAN)
    fp = writer.fingerprint(adapter).digest
    writer.close()
    key = {"fps": layout.FPS_KEY, "index": layout.index_key(fp),
           "stats-nodes": layout.NODES_KEY}[which]
    retype(rclient, key, kind)
    url = server.url
    cli("cache", "ls", "--redis", url)
    cli("cache", "ls", "--json", "--fingerprint", fp, "--redis", url)
    stats = json.loads(cli("cache", "stats", "--json", "--redis", url).output)
    assert stats["nodes"] == {} if which == "stats-nodes" else "writer" in stats["nodes"]
    verified = json.loads(cli("cache", "verify", "--json", "--redis", url).output)
    assert verified["bad"] == []
    cli("cache", "export", str(tmp_path / "out.tar"), "--redis", url)
    # a publication lands whatever the lists hold (a string at warmd:v1:fps used to fail
    # every publication cluster-wide), and so do its counters
    other = caches(url, node="other")
    more = DirAdapter(tmp_path / "b")
    publication = other.entries.publish_task(
        more, "t-new", [compile_entry(more, "kernel.new.0001")], 1.0)
    assert publication.written == 1 and "publish_failed" not in other.stats.counters
    assert other.stats.flush()
    reader = caches(url, node="reader")
    assert reader.entries.fetch_task(DirAdapter(tmp_path / "c"), "t-new") == ["kernel.new.0001"]
    # prune removes the planted key (the next writes rebuild it) and nothing else
    pruned = json.loads(cli("cache", "prune", "--json", "--redis", url).output)
    assert pruned["malformed_removed"] == 1 and pruned["orphan_blobs_removed"] == 0
    assert rclient.type(key) == b"none"
    counts = warm(caches(url, node="after"), DirAdapter(tmp_path / "d"), PLAN)
    assert counts["remote_hits"] == 4


def test_prune_keeps_chunks_of_manifests_no_list_names(server, rclient, caches, tmp_path):
    """Chunks are orphans only when no manifest uses them, whatever the fingerprint list
    says: a writer deleting it must not make prune delete every blob."""
    writer = caches(server.url, node="writer", ttl_seconds=60)
    adapter = DirAdapter(tmp_path / "a")
    warm(writer, adapter, PLAN)
    rclient.delete(layout.FPS_KEY)
    chunks = list(rclient.scan_iter(match=layout.blob_keys_pattern()))
    pruned = json.loads(cli("cache", "prune", "--json", "--redis", server.url).output)
    assert pruned["orphan_blobs_removed"] == 0
    assert all(rclient.exists(k) for k in chunks)


def test_a_flooded_learned_index_is_read_bounded_newest_first(server, rclient, caches,
                                                              tmp_path):
    node_a = caches(server.url, node="a")
    source = DirAdapter(tmp_path / "a")
    entry = compile_entry(source, "kernel.learned.0001")
    assert publish_learned(node_a, source, ["plan"], [entry]) == [entry.name]
    key = layout.learned_key(node_a.fingerprint(source).digest, "plan")
    index = json.loads(rclient.get(key))
    junk_at = time.time() - 3600  # older than the real entry
    index |= {f"kernel.junk{i}.0001": junk_at for i in range(20_000)}  # a keyless writer's
    index |= {f"kernel.future{i}.0001": 1e12 for i in range(5_000)}  # "newest"
    rclient.set(key, json.dumps(index))
    node_c = caches(server.url, node="c")
    dest = DirAdapter(tmp_path / "c")
    names = node_c.lists.learned(dest, "plan")
    assert len(names) == layout.MAX_LEARNED and names[0] == entry.name
    assert not any("future" in n for n in names)
    assert node_c.stats.counters["learned_cut"] == 25_001 - layout.MAX_LEARNED
    assert install_learned(node_c, dest, "plan") == [entry.name]
    assert [e.name for e in dest.list_entries()] == [entry.name]
    rows = json.loads(cli("cache", "ls", "--learned", "--json", "--redis", server.url).output)
    assert len(rows) == layout.MAX_LEARNED
    # An index past the byte bound is not read at all: nothing learned, nothing installed.
    rclient.set(key, json.dumps({f"kernel.x{i:07d}.0001": 1.0 for i in range(200_000)}))
    assert len(rclient.get(key)) > json_values.MAX_INDEX_BYTES
    assert node_c.lists.learned(DirAdapter(tmp_path / "d"), "plan") == []


def test_adding_to_a_learned_index_keeps_its_newest_names(server, rclient, caches, tmp_path):
    node = caches(server.url, node="a")
    adapter = DirAdapter(tmp_path / "a")
    key = layout.learned_key(node.fingerprint(adapter).digest, "plan")
    rclient.set(key, json.dumps({f"kernel.old{i}.0001": 1.0 + i
                                 for i in range(layout.MAX_LEARNED)}))
    assert node.lists.add_learned(adapter, "plan", ["kernel.fresh.0001"])
    index = json.loads(rclient.get(key))
    assert len(index) == layout.MAX_LEARNED
    assert "kernel.fresh.0001" in index and "kernel.old0.0001" not in index
    assert rclient.pttl(key) > 0  # it lives as long as entries do
    assert learned_task("plan", "kernel.fresh.0001")  # the task each learned name stands for


@pytest.mark.parametrize("edit", [
    {"entries": []},  # used to settle the task with nothing installed
    {"entries": ["kernel.w0_0.00000000", "kernel.w0_0.00000000"]},
    {"compile_seconds": -5.0},
], ids=["empty", "duplicate", "negative-seconds"])
def test_an_empty_or_inconsistent_task_record_is_refused_like_any_bad_record(
        edit, server, rclient, caches, tmp_path):
    writer = caches(server.url, node="writer")
    adapter = DirAdapter(tmp_path / "a")
    warm(writer, adapter, PLAN)
    fp = writer.fingerprint(adapter).digest
    task = sorted(PLAN)[0]
    key = layout.task_key(fp, task)
    rclient.set(key, json_bytes({**json.loads(rclient.get(key)), **edit}))
    node = caches(server.url, node="b")
    dest = DirAdapter(tmp_path / "b")
    assert node.entries.prefetch(dest, list(PLAN))[task] is None
    assert node.stats.counters["corrupt_rejected"] == 1
    counts = warm(caches(server.url, node="c"), DirAdapter(tmp_path / "c"), PLAN)
    # its entries are still published one by one: installed, nothing compiled again, and
    # the task's record written anew
    assert counts["compiled"] == 0 and counts["remote_hits"] == 4
    assert StoredTaskRecord.decode(rclient.get(key)).entries == tuple(PLAN[task])


class UnboundedJsonAdapter(DirAdapter):
    """The test library with an adapter that, like a library's own loader, parses a JSON
    file of each entry before installing it, with json.loads and no bounds."""

    def install(self, name: str, artifact: bytes):
        with tarfile.open(fileobj=io.BytesIO(artifact), mode="r:gz") as tar:
            json.loads(tar.extractfile("config.json").read())
        return super().install(name, artifact)


def test_content_an_adapter_cannot_parse_is_quarantined_not_an_install_failure(
        server, rclient, caches, tmp_path):
    """Nested 100,000 deep, it raised RecursionError out of install: counted install_failed
    and left in place, so every node fetched it again."""
    writer = caches(server.url, node="writer")
    source = UnboundedJsonAdapter(tmp_path / "a")
    entry = compile_entry(source, "kernel.deep.0001")
    (entry.path / "config.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    assert writer.entries.publish_task(source, "t", [entry], 1.0).written == 1
    fp = writer.fingerprint(source).digest
    reader = caches(server.url, node="reader")
    assert reader.entries.fetch_task(UnboundedJsonAdapter(tmp_path / "b"), "t") is None
    counters = reader.stats.counters
    assert counters["unsafe_rejected"] == 1 and counters["quarantined"] == 1, counters
    assert "install_failed" not in counters
    assert not rclient.exists(layout.manifest_key(fp, entry.name))
