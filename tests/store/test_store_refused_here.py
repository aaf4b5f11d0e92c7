"""Entries a node refuses as not working here (IncompatibleHere), against a real
redis-server: its own build replaces the stored one (kept under the quarantine key,
counted), so nodes like it stop compiling again until the entry's TTL; entries over a
node's own limits are never replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from store_support import DirAdapter, compile_entry, module_server

from warmd.cache.base import CacheEntry, IncompatibleHere
from warmd.store import layout

server = module_server("refused-here-pw")
NAME = "kernel.flavoured.0001"


class FlavouredAdapter(DirAdapter):
    """The test library on nodes of one kind: an entry built on another kind does not work
    here (what FlashInfer's adapter says of a module built against files missing here)."""

    def __init__(self, root: Path, flavour: str) -> None:
        super().__init__(root)
        self.flavour = flavour

    def build(self, name: str) -> CacheEntry:
        entry = compile_entry(self, name)
        (entry.path / "flavour").write_text(self.flavour)
        return entry

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        entry = super().install(name, artifact)
        if (entry.path / "flavour").read_text() != self.flavour:
            shutil.rmtree(entry.path)
            raise IncompatibleHere("built for another kind of node")
        return entry


def publish(cache, adapter: FlavouredAdapter):
    return cache.entries.publish_task(adapter, "t", [adapter.build(NAME)], 1.0)


def test_an_entry_that_does_not_work_here_is_replaced_by_this_nodes_build(
        server, rclient, caches, tmp_path):
    a = FlavouredAdapter(tmp_path / "a", "a")
    assert publish(caches(server.url, node="a"), a).written == 1
    fp = caches(server.url).fingerprint(a).digest
    b_node = caches(server.url, node="b")
    b = FlavouredAdapter(tmp_path / "b", "b")
    assert b_node.entries.fetch_task(b, "t") is None and b_node.stats.counters["refused_here"] == 1
    assert publish(b_node, b).written == 1  # compiled here, and replaces a's
    assert b_node.stats.counters["replaced"] == 1
    note = json.loads(rclient.get(layout.quarantine_key(fp, NAME)))
    assert note["manifest"]["producer"] == "a"
    another_b = caches(server.url, node="b2")
    assert another_b.entries.fetch_task(FlavouredAdapter(tmp_path / "b2", "b"), "t") == [NAME]


def test_an_entry_over_this_nodes_limit_is_never_replaced(server, rclient, caches, tmp_path,
                                                         monkeypatch):
    """An entry that unpacks past this node's own limit works elsewhere: this node's build
    (another digest) leaves it in place."""
    def zeros_build(adapter: FlavouredAdapter) -> CacheEntry:
        entry = adapter.build(NAME)
        (entry.path / "kernel.bin").write_bytes(bytes(600_000))  # small packed, large unpacked
        return entry

    a = FlavouredAdapter(tmp_path / "a", "a")
    assert caches(server.url, node="a").entries.publish_task(a, "t", [zeros_build(a)], 1.0).written
    fp = caches(server.url).fingerprint(a).digest
    stored = rclient.get(layout.manifest_key(fp, NAME))
    monkeypatch.setenv("WARMD_MAX_ARTIFACT_BYTES", "100000")
    small = caches(server.url, node="small")
    s = FlavouredAdapter(tmp_path / "s", "s")
    assert small.entries.fetch_task(s, "t") is None and small.stats.counters["refused_here"] == 1
    monkeypatch.delenv("WARMD_MAX_ARTIFACT_BYTES")  # so that this node can pack its own
    assert small.entries.publish_task(s, "t", [zeros_build(s)], 1.0).already_published == 1
    assert rclient.get(layout.manifest_key(fp, NAME)) == stored
    assert "replaced" not in small.stats.counters
