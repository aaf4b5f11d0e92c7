"""Regressions against a real redis-server: a node's own refusals never delete entries other
nodes can use; unix:// URLs; passwords never shown; malformed keys and archives in admin."""

from __future__ import annotations

import io
import json
import logging
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, compile_entry, start_test_server

from warmd.cache.base import CacheEntry, IncompatibleHere
from warmd.cache.packing import pack_directory
from warmd.cli import main
from warmd.store import admin, digest_of, free_port, layout
from warmd.store.formats import Manifest, json_bytes


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # A short socket path (the limit is ~107 bytes): tmp_path can be longer.
    sock_dir = Path(tempfile.mkdtemp(prefix="wr", dir="/tmp"))
    srv = start_test_server(tmp_path_factory.mktemp("redis"), password="refusal-pw",
                            config={"unixsocket": str(sock_dir / "r.sock"),
                                    "unixsocketperm": "700"})
    yield srv, sock_dir / "r.sock"
    srv.stop()
    (sock_dir / "r.sock").unlink(missing_ok=True)
    sock_dir.rmdir()


@pytest.fixture
def server(served):
    return served[0]


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def _zeros_entry(adapter: DirAdapter, name: str, size: int) -> CacheEntry:
    """An entry that compresses well: small blob, large once unpacked."""
    path = adapter.root / name
    path.mkdir(parents=True)
    (path / "kernel.bin").write_bytes(bytes(size))
    (path / "done").write_text("ok")
    return CacheEntry(adapter.library, name, path)


def _manifest(rclient, fp: str, name: str) -> Manifest:
    return Manifest.decode(rclient.get(layout.manifest_key(fp, name)), 1 << 30)


# ----------------------------------------------------------------------------- refusals

def test_too_large_manifest_here_is_a_miss_not_a_quarantine(server, rclient, caches, tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.big.0001", 300_000)], 1.0)
    fp = writer.fingerprint(a).digest
    small = caches(server.url, max_artifact_bytes=100_000)
    assert small.entries.fetch_task(DirAdapter(tmp_path / "b"), "t") is None
    assert small.stats.counters.get("refused_here") == 1
    assert "quarantined" not in small.stats.counters
    assert "corrupt_rejected" not in small.stats.counters
    assert rclient.exists(layout.manifest_key(fp, "kernel.big.0001"))
    assert not rclient.exists(layout.quarantine_key(fp, "kernel.big.0001"))
    assert caches(server.url).entries.fetch_task(
        DirAdapter(tmp_path / "c"), "t") == ["kernel.big.0001"]
    # ls and prune on the small node see the entry and keep its chunks
    listed = admin.entries(small, fp)
    assert listed[0]["manifest"] is not None
    assert admin.prune(small).orphan_blobs_removed == 0
    assert rclient.exists(layout.blob_key(_manifest(rclient, fp, "kernel.big.0001").digest, 0))


def test_unpack_limit_here_keeps_shared_blob_for_other_fingerprints(server, rclient, caches,
                                                                    tmp_path, monkeypatch):
    one, two = DirAdapter(tmp_path / "src", "1.0"), DirAdapter(tmp_path / "src", "2.0")
    entry = _zeros_entry(one, "kernel.zeros.0001", 600_000)
    for adapter in (one, two):  # the same bytes under two fingerprints share one blob
        caches(server.url).entries.publish_task(adapter, "t", [entry], 1.0)
    fp1 = caches(server.url).fingerprint(one).digest
    digest = _manifest(rclient, fp1, entry.name).digest
    monkeypatch.setenv("WARMD_MAX_ARTIFACT_BYTES", "100000")
    small = caches(server.url)
    assert small.entries.fetch_task(DirAdapter(tmp_path / "b", "1.0"), "t") is None
    assert small.stats.counters.get("refused_here") == 1
    assert "quarantined" not in small.stats.counters
    assert rclient.exists(layout.manifest_key(fp1, entry.name), layout.blob_key(digest, 0)) == 2
    monkeypatch.delenv("WARMD_MAX_ARTIFACT_BYTES")
    assert caches(server.url).entries.fetch_task(
        DirAdapter(tmp_path / "c", "2.0"), "t") == [entry.name]


def test_quarantine_leaves_chunks_another_fingerprint_uses(server, rclient, caches, tmp_path):
    one, two = DirAdapter(tmp_path / "src", "1.0"), DirAdapter(tmp_path / "src", "2.0")
    entry = compile_entry(one, "kernel.shared.0001", 50_000)
    for adapter in (one, two):
        caches(server.url).entries.publish_task(adapter, "t", [entry], 1.0)
    fp1 = caches(server.url).fingerprint(one).digest
    man = _manifest(rclient, fp1, entry.name)
    # fp1's manifest alone is damaged (a wrong size): its blob check fails there only
    data = dict(man.to_json(), size=man.size + 1)
    rclient.set(layout.manifest_key(fp1, entry.name), json_bytes(data))
    reader = caches(server.url)
    assert reader.entries.fetch_task(DirAdapter(tmp_path / "b", "1.0"), "t") is None
    assert reader.stats.counters["quarantined"] == 1
    assert rclient.exists(layout.blob_key(man.digest, 0))
    assert caches(server.url).entries.fetch_task(
        DirAdapter(tmp_path / "c", "2.0"), "t") == [entry.name]


class IncompatibleHereAdapter(DirAdapter):
    """The test library on a node that cannot use its entries (FlashInfer's adapter raises
    IncompatibleHere when, say, its ninja cannot relocate a build)."""

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        raise IncompatibleHere("built against files missing here")


def test_incompatible_entry_is_refused_here_only(server, rclient, caches, tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    fp = writer.fingerprint(a).digest
    reader = caches(server.url)
    assert reader.entries.fetch_task(IncompatibleHereAdapter(tmp_path / "b"), "t") is None
    assert reader.stats.counters.get("refused_here") == 1
    assert "quarantined" not in reader.stats.counters
    assert rclient.exists(layout.manifest_key(fp, "kernel.x.0001"))


def test_unsigned_garbage_under_a_key_is_quarantined_only_by_the_clusters_key(
        server, rclient, caches, tmp_path):
    # Never quarantining it would be wrong: a planted unsigned manifest would block sharing
    # for good. A node with another key still leaves it alone.
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url, signing_key=b"k")
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    fp = writer.fingerprint(a).digest
    rclient.set(layout.manifest_key(fp, "kernel.x.0001"), b"not json")
    other = caches(server.url, signing_key=b"other")
    assert other.entries.fetch_task(DirAdapter(tmp_path / "c"), "t") is None
    assert other.stats.counters["signature_rejected"] == 1
    assert "quarantined" not in other.stats.counters
    assert rclient.get(layout.manifest_key(fp, "kernel.x.0001")) == b"not json"
    reader = caches(server.url, signing_key=b"k")
    assert reader.entries.fetch_task(DirAdapter(tmp_path / "b"), "t") is None
    assert reader.stats.counters["signature_rejected"] == 1
    assert reader.stats.counters["quarantined"] == 1
    assert not rclient.exists(layout.manifest_key(fp, "kernel.x.0001"))


def test_wrong_type_chunk_is_a_bad_entry_not_a_failed_fetch(server, rclient, caches, tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    writer.entries.publish_task(a, "t1", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    writer.entries.publish_task(a, "t2", [compile_entry(a, "kernel.y.0001", 10_000)], 1.0)
    fp = writer.fingerprint(a).digest
    key = layout.blob_key(_manifest(rclient, fp, "kernel.x.0001").digest, 0)
    rclient.delete(key)
    rclient.hset(key, "x", "y")
    out = tmp_path / "out.tar"
    counts = json.loads(run("cache", "export", str(out), "--json", "--redis",
                            server.url).output)
    assert counts["entries"] == 1 and counts["skipped"] == 1
    reader = caches(server.url)
    assert reader.entries.prefetch(DirAdapter(tmp_path / "b"), ["t1", "t2"]) == {
        "t1": None, "t2": ["kernel.y.0001"]}
    assert reader.stats.counters["quarantined"] == 1 and reader.stats.counters["remote_hits"] == 1


# ----------------------------------------------------------------------------- URLs

def test_unix_socket_url_works(served, rclient, caches, tmp_path):
    url = f"unix://{served[1]}?db=0&password=refusal-pw"
    a = DirAdapter(tmp_path / "a")
    writer = caches(url)
    assert writer.ping()
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    assert writer.stats.counters["published"] == 1
    assert caches(url).entries.fetch_task(DirAdapter(tmp_path / "b"), "t") == ["kernel.x.0001"]
    assert json.loads(run("cache", "ls", "--json", "--redis", url).output)[0]["entries"] == 1
    assert "refusal-pw" not in writer.display_url


def test_unix_socket_errors_are_one_line():
    began = time.monotonic()
    result = run("cache", "ls", "--redis", "unix:///nonexistent.sock", code=1)
    # no socket file: nothing to wait for (the join budget is for a slow store, 60 s)
    assert time.monotonic() - began < 15
    assert result.output.startswith("warmd: error: ") and result.output.count("\n") == 1
    result = run("cache", "ls", "--redis", "unix:///x.sock?socket_timeout=abc", code=2)
    assert "socket_timeout" in result.output and result.output.count("\n") == 1


@pytest.mark.parametrize("password", ["abc/DEF+gh", "Se#cret", "p?w@x"])
def test_passwords_with_url_delimiters_never_shown(password, caplog):
    raw = f"redis://writer:{password}@cache.internal:6379/0"
    result = run("cache", "ls", "--redis", raw, code=2)
    assert "invalid Redis URL" in result.output and password not in result.output
    assert "writer:***@" in result.output or "***@" in result.output
    encoded = password.replace("/", "%2F").replace("#", "%23").replace("?", "%3F")
    encoded = encoded.replace("@", "%40")
    unreachable = f"redis://:{encoded}@127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="warmd.store"):
        result = run("cache", "stats", "--redis", unreachable, code=1)
    shown = result.output + caplog.text
    assert "unreachable" in result.output
    assert password not in shown and encoded not in shown


# ----------------------------------------------------------------------------- admin

def test_malformed_fingerprint_keys_do_not_break_admin(server, rclient, caches, tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    good = writer.fingerprint(a).digest
    for i, raw in enumerate([b"not json", b"[1, 2]", b'{"library": "x", "inputs": "ab"}']):
        fp = f"{i:064x}"
        rclient.set(layout.fp_meta_key(fp), raw)
        rclient.zadd(layout.FPS_KEY, {fp: time.time()})
    url = server.url
    listed = json.loads(run("cache", "ls", "--json", "--redis", url).output)
    assert {e["fingerprint"] for e in listed} >= {good} and len(listed) == 4
    assert sum(bool(e.get("malformed")) for e in listed) == 3
    run("cache", "stats", "--json", "--redis", url)
    run("cache", "prune", "--older-than", "1", "--redis", url)
    out = tmp_path / "out.tar"
    counts = json.loads(run("cache", "export", str(out), "--json", "--redis", url).output)
    assert counts["fingerprints"] == 1 and counts["entries"] == 1


def test_export_skips_odd_task_keys_and_leaves_no_partial_on_error(server, rclient, caches,
                                                                     tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    writer.entries.publish_task(a, "t", [compile_entry(a, "kernel.x.0001", 10_000)], 1.0)
    fp = writer.fingerprint(a).digest
    rclient.hset(layout.task_key(fp, "odd"), "x", "y")  # not a string: skipped
    out = tmp_path / "out.tar"
    counts = json.loads(run("cache", "export", str(out), "--json", "--redis",
                            server.url).output)
    assert counts["entries"] == 1 and counts["tasks"] == 1
    taken = tmp_path / "taken"  # a directory in the way: the final rename fails
    (taken / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        admin.export_archive(writer, taken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "out.tar", "taken"]


def test_import_refuses_fingerprint_inputs_that_are_not_a_mapping(server, rclient, tmp_path):
    inputs = "ab"  # its digest is what the member names say, but it is not a mapping
    fp = digest_of(inputs)
    src = tmp_path / "e"
    src.mkdir()
    (src / "kernel.bin").write_bytes(b"y" * 100)
    blob = pack_directory(src)
    name = "kernel.x.0001"
    man = Manifest("testlib", name, fp, layout.sha256(blob), len(blob), "p", 1.0,
                   time.time())
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in [
                ("warmd-export.json", json.dumps({"format": admin.EXPORT_FORMAT,
                                                  "version": 1}).encode()),
                (f"fp/{fp}.json", json.dumps({"library": "testlib", "digest": fp,
                                              "inputs": inputs}).encode()),
                (f"man/{fp}/{name}.json", man.encode()), (f"blob/{man.digest}", blob)]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    counts = json.loads(run("cache", "import", str(path), "--json", "--redis",
                            server.url).output)
    assert counts["imported"] == 0 and counts["corrupt_rejected"] == 1
    assert not rclient.exists(layout.manifest_key(fp, name))
