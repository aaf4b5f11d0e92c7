"""The shared cache against a real redis-server: roundtrips, integrity, trust, single flight
(faults: test_store_redis_faults.py; stats: test_store_redis_stats.py)."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest
from store_support import (
    DirAdapter,
    compile_entry,
    module_server,
    publish_entries,
    start_test_server,
    task_entries,
    warm,
)

from warmd.store import layout
from warmd.store.formats import Manifest, json_bytes

server = module_server("admin-pw")

# Caches made by the shared `caches` fixture (tests/conftest.py) poll quickly here.
CACHE_DEFAULTS = {"poll_interval": 0.1}


def _fp(cache, adapter) -> str:
    return cache.fingerprint(adapter).digest


def _outside_files(tmp_path: Path, *roots: Path) -> set[Path]:
    return {p for p in tmp_path.rglob("*") if not any(r in p.parents or p == r for r in roots)}


# ----------------------------------------------------------------------------- roundtrips

def test_publish_then_fetch_installs_verified_entries(server, rclient, caches, tmp_path):
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    writer, reader = caches(server.url), caches(server.url)
    big = "kernel.big.0001"
    publish_entries(writer, a, "testlib/t1", ["kernel.x.0001", big], size=2_500_000)
    fp = _fp(writer, a)
    man = Manifest.decode(rclient.get(layout.manifest_key(fp, big)), 1 << 30)
    assert man.chunks == 3 and man.producer == "node0" and man.compile_seconds == 1.0
    assert all(len(rclient.get(layout.blob_key(man.digest, i))) <= 1 << 20 for i in range(3))

    assert reader.entries.fetch_task(b, "testlib/t1") == ["kernel.x.0001", big]
    for name in ("kernel.x.0001", big):
        assert (b.root / name / "kernel.bin").read_bytes() == \
            (a.root / name / "kernel.bin").read_bytes()
    counters = reader.stats.counters
    assert counters["remote_hits"] == 2 and counters["tasks_hit"] == 1
    assert counters["bytes_fetched"] > 2_500_000 and counters["compile_seconds_saved"] == 2.0
    assert reader.entries.fetch_task(b, "testlib/unknown") is None
    # Already installed by this process: nothing fetched again, and not counted
    # again either: one installed entry is one remote hit, not also a local hit.
    assert reader.entries.fetch_task(b, "testlib/t1") == ["kernel.x.0001", big]
    assert "local_hits" not in reader.stats.counters and reader.stats.counters["remote_hits"] == 2
    assert reader.stats.counters["tasks_hit"] == 1
    # Present before this process looked: a local hit.
    other = caches(server.url)
    assert other.entries.fetch_task(b, "testlib/t1") == ["kernel.x.0001", big]
    assert other.stats.counters["local_hits"] == 2 and "remote_hits" not in other.stats.counters


def test_prefetch_a_plan_and_ttl_refresh(server, rclient, caches, tmp_path):
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    writer = caches(server.url, ttl_seconds=3600)
    plan = task_entries(12)
    for task, names in plan.items():
        publish_entries(writer, a, task, names, size=20_000)
    fp = _fp(writer, a)
    key = layout.manifest_key(fp, plan["testlib/gemm/3"][0])
    assert 3_500_000 < rclient.pttl(key) <= 3_600_000
    rclient.pexpire(key, 5000)
    reader = caches(server.url, ttl_seconds=3600)
    got = reader.entries.prefetch(b, list(plan) + ["testlib/missing"])
    assert got["testlib/missing"] is None
    assert all(got[t] == names for t, names in plan.items())
    assert len(b.list_entries()) == 24
    assert rclient.pttl(key) > 3_500_000  # used: its TTL was refreshed


def test_same_entry_published_twice_is_stored_once(server, rclient, caches, tmp_path):
    one, two = caches(server.url), caches(server.url)
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    publish_entries(one, a, "testlib/t", ["kernel.same.0001"])
    publish_entries(two, b, "testlib/t", ["kernel.same.0001"])
    assert one.stats.counters["published"] == 1 and two.stats.counters["already_published"] == 1
    assert "published" not in two.stats.counters


def test_kernels_published_as_built_count_once(server, rclient, caches, tmp_path):
    """Each kernel is published as it is built, then named again by its task's record:
    the node stored each once, and none was another node's."""
    plan = task_entries(2, per_task=2)
    cache = caches(server.url)
    assert warm(cache, DirAdapter(tmp_path / "a"), plan)["compiled"] == 4
    assert cache.stats.counters["published"] == 4
    assert "already_published" not in cache.stats.counters


def test_an_entry_built_here_while_a_fetch_runs_is_no_remote_hit(server, caches, tmp_path):
    """On a node whose compile threads finish kernels while it installs others' (cluster
    boot), only what the store installed counts as installed: a kernel built here in the
    meantime stays this node's compile (on the H200 one per node was counted a remote hit)."""
    from warmd.warmup.state import LibraryState

    writer = caches(server.url, node="other")
    source = DirAdapter(tmp_path / "other")
    writer.entries.publish_entries(source, [compile_entry(source, "kernel.theirs.0001")], 1.0)
    here = DirAdapter(tmp_path / "here")
    library = LibraryState(here.library, here)
    reader = caches(server.url, node="here")

    def install_while_building(adapter):
        compile_entry(adapter, "kernel.mine.0001")  # a compile thread's, meanwhile
        return reader.entries.install_entries(adapter, ["kernel.theirs.0001"])

    assert "kernel.theirs.0001" in library.installing(reader, install_while_building)
    assert library.installed() == {"kernel.theirs.0001"}


# ----------------------------------------------------------------------------- integrity

def _corrupt_cases(rclient, fp, man, other):
    """name -> a function that damages the stored entry `man` in one way."""
    chunk = layout.blob_key(man.digest, 0)

    def flip():
        data = bytearray(rclient.get(chunk))
        data[len(data) // 2] ^= 0x01
        rclient.set(chunk, bytes(data))

    return {
        "flipped bit": flip,
        "truncated": lambda: rclient.set(chunk, rclient.get(chunk)[:-100]),
        "missing chunk": lambda: rclient.delete(chunk),
        "swapped blob": lambda: rclient.set(chunk, rclient.get(layout.blob_key(other.digest,
                                                                                0))),
        "swapped manifest": lambda: rclient.set(layout.manifest_key(fp, man.name),
                                                rclient.get(layout.manifest_key(fp,
                                                                                other.name))),
    }


@pytest.mark.parametrize("case", ["flipped bit", "truncated", "missing chunk", "swapped blob",
                                  "swapped manifest"])
def test_damaged_entries_are_refused_quarantined_and_rebuilt(server, rclient, caches,
                                                             tmp_path, case):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url)
    publish_entries(writer, a, "testlib/bad", ["kernel.victim.0001"])
    publish_entries(writer, a, "testlib/good", ["kernel.other.0001"])
    fp = _fp(writer, a)
    read = lambda name: Manifest.decode(  # noqa: E731
        rclient.get(layout.manifest_key(fp, name)), 1 << 30)
    man, other = read("kernel.victim.0001"), read("kernel.other.0001")
    _corrupt_cases(rclient, fp, man, other)[case]()

    b = DirAdapter(tmp_path / "b")
    reader = caches(server.url)
    assert reader.entries.fetch_task(b, "testlib/bad") is None
    assert not (b.root / "kernel.victim.0001").exists()
    assert reader.stats.counters["corrupt_rejected"] == 1
    assert reader.stats.counters["quarantined"] == 1
    assert rclient.get(layout.manifest_key(fp, "kernel.victim.0001")) is None
    assert rclient.exists(layout.quarantine_key(fp, "kernel.victim.0001"))
    # Nothing valid lost: the other entry still installs (its blob survived).
    assert reader.entries.fetch_task(b, "testlib/good") == ["kernel.other.0001"]
    # The next compile republishes the victim, and it hits again.
    with reader.claims.single_flight("testlib/bad", 5) as mine:
        assert mine
        publish_entries(reader, b, "testlib/bad", ["kernel.victim.0001"])
    c = DirAdapter(tmp_path / "c")
    assert caches(server.url).entries.fetch_task(c, "testlib/bad") == ["kernel.victim.0001"]
    assert (c.root / "kernel.victim.0001" / "kernel.bin").read_bytes() == \
        (a.root / "kernel.victim.0001" / "kernel.bin").read_bytes()


def test_signatures_are_required_when_a_key_is_configured(server, rclient, caches, tmp_path):
    a = DirAdapter(tmp_path / "a")
    # unsigned first: once the key proof is there, a node without the key publishes nothing
    publish_entries(caches(server.url), a, "testlib/unsigned", ["kernel.u.0001"])
    publish_entries(caches(server.url, signing_key=b"cluster-key"), a, "testlib/signed",
             ["kernel.s.0001"])

    wrong = caches(server.url, signing_key=b"another-key")
    b = DirAdapter(tmp_path / "b")
    assert wrong.entries.fetch_task(b, "testlib/signed") is None
    assert wrong.stats.counters["signature_rejected"] == 1
    assert wrong.stats.counters["corrupt_rejected"] == 1
    strict = caches(server.url, signing_key=b"cluster-key")
    assert strict.entries.fetch_task(b, "testlib/unsigned") is None
    assert strict.stats.counters["signature_rejected"] == 1
    assert b.list_entries() == []
    # Refused, not quarantined: a node with a wrong key cannot wipe valid entries.
    assert "quarantined" not in wrong.stats.counters
    assert strict.entries.fetch_task(b, "testlib/signed") == ["kernel.s.0001"]

    # A manifest re-signed with the wrong key over a tampered digest is refused too.
    fp = _fp(strict, a)
    key = layout.manifest_key(fp, "kernel.s.0001")
    forged = Manifest.decode(rclient.get(key), 1 << 30).to_json()
    from warmd.store.signing import sign

    rclient.set(key, json_bytes(sign(dict(forged, producer="mallory"), b"guess")))
    c = DirAdapter(tmp_path / "c")
    assert caches(server.url, signing_key=b"cluster-key").entries.fetch_task(c, "testlib/signed") \
        is None
    assert c.list_entries() == []


def test_unsafe_artifact_is_refused_and_writes_nothing_outside(server, rclient, caches,
                                                                tmp_path):
    a = DirAdapter(tmp_path / "a")
    writer = caches(server.url, signing_key=b"k")
    publish_entries(writer, a, "testlib/t", ["kernel.evil.0001"])
    fp = _fp(writer, a)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"owned"))
    blob = raw.getvalue()
    # Correct digest and a valid signature: only the archive itself is bad.
    man = Manifest("testlib", "kernel.evil.0001", fp, layout.sha256(blob), len(blob),
                   "mallory", 1.0, time.time())
    from warmd.store.signing import sign

    rclient.set(layout.blob_key(man.digest, 0), blob)
    rclient.set(layout.manifest_key(fp, man.name),
                json_bytes(sign(man.to_json(), b"k")))
    b = DirAdapter(tmp_path / "b")
    reader = caches(server.url, signing_key=b"k")
    before = _outside_files(tmp_path, a.root, b.root)
    assert reader.entries.fetch_task(b, "testlib/t") is None
    assert reader.stats.counters["unsafe_rejected"] == 1
    assert reader.stats.counters["quarantined"] == 1
    assert _outside_files(tmp_path, a.root, b.root) == before
    assert not list(tmp_path.rglob("escaped.txt")) and b.list_entries() == []


# ----------------------------------------------------------------------------- ACL, TLS

def _acl_users(rclient) -> None:
    rclient.execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~warmd:*",
                            "&warmd:*", "-@all", "+@read", "+@connection", "+subscribe",
                            "+evalsha", "+eval")
    rclient.execute_command("ACL", "SETUSER", "writer", "on", ">writer-pw", "~warmd:*",
                            "&warmd:*", "-@all", "+@read", "+@write", "+@connection",
                            "+@pubsub", "+@scripting", "-@dangerous")


def test_acl_reader_reads_but_cannot_publish(server, rclient, caches, tmp_path):
    _acl_users(rclient)
    port = server.port
    writer = caches(f"redis://writer:writer-pw@127.0.0.1:{port}/0")
    reader = caches(f"redis://reader:reader-pw@127.0.0.1:{port}/0")
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    publish_entries(writer, a, "testlib/w", ["kernel.w.0001"])
    assert writer.stats.counters["published"] == 1
    assert reader.entries.fetch_task(b, "testlib/w") == ["kernel.w.0001"]

    keys_before = set(rclient.keys("warmd:v1:*"))
    publish_entries(reader, b, "testlib/r", ["kernel.r.0001"])  # no exception
    assert reader.stats.counters["publish_denied"] == 1 and reader.read_only
    publish_entries(reader, b, "testlib/r2", ["kernel.r.0002"])
    assert reader.stats.counters["publish_skipped"] == 1  # it stops trying
    assert {k for k in rclient.keys("warmd:v1:*")} - keys_before <= {
        k for k in rclient.keys("warmd:v1:stats:*")}
    # A reader takes no lease: nobody holds one, so it compiles right away.
    with reader.claims.single_flight("testlib/r3", 5) as mine:
        assert mine
    assert not rclient.keys("warmd:v1:lease:*")


def test_tls_with_auth(tmp_path, caches):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path / "tls"
    d.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    cert = str(d / "cert.pem")
    srv = start_test_server(tmp_path, password="tls-pw", tls=(cert, str(d / "key.pem"), cert))
    try:
        assert srv.url.startswith("rediss://")
        a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
        publish_entries(caches(srv.url), a, "testlib/tls", ["kernel.t.0001"])
        assert caches(srv.url).entries.fetch_task(b, "testlib/tls") == ["kernel.t.0001"]
        # Without the CA the certificate is not trusted: a miss, never an exception.
        untrusted = caches(srv.url.split("?")[0])
        began = time.monotonic()
        assert untrusted.entries.fetch_task(DirAdapter(tmp_path / "c"), "testlib/tls") is None
        assert time.monotonic() - began < 15  # not retried for the join budget (60 s)
        assert untrusted.stats.counters["store_errors"] >= 1
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- single flight

def test_single_flight_waiter_gets_the_publication(server, rclient, caches, tmp_path):
    holder, waiter = caches(server.url), caches(server.url)
    a, b = DirAdapter(tmp_path / "a"), DirAdapter(tmp_path / "b")
    assert holder.entries.fetch_task(a, "testlib/sf") is None
    assert waiter.entries.fetch_task(b, "testlib/sf") is None
    seen = {}

    def wait():
        start = time.monotonic()
        with waiter.claims.single_flight("testlib/sf", 20) as mine:
            seen["mine"], seen["waited"] = mine, time.monotonic() - start

    with holder.claims.single_flight("testlib/sf", 20) as mine:
        assert mine
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)
        assert "mine" not in seen  # still waiting for the holder
        publish_entries(holder, a, "testlib/sf", ["kernel.sf.0001"])
    thread.join(10)
    assert seen["mine"] is False and 0.4 < seen["waited"] < 5
    assert waiter.entries.fetch_task(b, "testlib/sf") == ["kernel.sf.0001"]
    assert waiter.stats.counters["lease_waits"] == 1
    assert waiter.stats.counters["lease_waits_satisfied"] == 1
    assert not rclient.keys("warmd:v1:lease:*")


def test_single_flight_waiter_times_out(server, rclient, caches, tmp_path):
    # Taking over a released lease: tests/store_contract.py (run on Redis by
    # test_store_contract.py).
    holder, waiter = caches(server.url), caches(server.url, lease_seconds=1.0)
    # A holder that never finishes: the waiter gives up after its timeout and compiles.
    with holder.claims.single_flight("testlib/slow", 20):
        start = time.monotonic()
        with waiter.claims.single_flight("testlib/slow", 0.5) as mine:
            assert mine and time.monotonic() - start < 2
    assert waiter.stats.counters["lease_timeouts"] == 1


def test_deep_gemm_entries_roundtrip_through_the_store(server, rclient, caches, tmp_path):
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter

    src = DeepGemmCacheAdapter(tmp_path / "src", arch="9.0a", sms=132)
    names = [f"kernel.sm90_fp8_gemm_1d2d.{i:032x}" for i in range(3)]
    for i, name in enumerate(names):
        path = src.entries_dir / name
        path.mkdir(parents=True)
        (path / "kernel.cu").write_text(f"// {name}\n")
        (path / "kernel.cubin").write_bytes(os.urandom(60_000 + 30_000 * i))
    writer = caches(server.url)
    writer.entries.publish_task(src, "deep_gemm/fp8_gemm_nt/4096x7168/x", src.list_entries(), 12.0)
    dest = DeepGemmCacheAdapter(tmp_path / "dest", arch="9.0a", sms=132)
    assert caches(server.url).entries.fetch_task(dest, "deep_gemm/fp8_gemm_nt/4096x7168/x") == names
    for name in names:
        for part in ("kernel.cu", "kernel.cubin"):
            assert (dest.entries_dir / name / part).read_bytes() == \
                (src.entries_dir / name / part).read_bytes()
    # Another SM count is another fingerprint: nothing to take.
    h20 = DeepGemmCacheAdapter(tmp_path / "h20", arch="9.0a", sms=78)
    assert caches(server.url).entries.fetch_task(h20, "deep_gemm/fp8_gemm_nt/4096x7168/x") is None
