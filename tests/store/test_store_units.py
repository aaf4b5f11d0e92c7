"""Shared-cache pieces that need no server: signatures, URLs, fingerprints, records, breaker."""

from __future__ import annotations

import pytest

from warmd.errors import WarmdInputError
from warmd.store import layout, signing
from warmd.store.breaker import CircuitBreaker
from warmd.store.chunking import check_blob, split_chunks
from warmd.store.connection import classify, parse_store_url, redact, scrub
from warmd.store.fingerprint import fingerprint_of
from warmd.store.formats import Manifest, accept_manifest, json_bytes
from warmd.store.validation import BadRecord, SignatureRefused
from warmd.targets import PRESETS, Target


def test_signature_roundtrip_and_refusals():
    record = {"name": "kernel.a", "digest": "ab" * 32}
    signed = signing.sign(record, b"k1")
    assert signing.check(signed, b"k1") is None
    assert "bad signature" in signing.check(signed, b"k2")
    assert "unsigned" in signing.check(record, b"k1")
    assert signing.check(record, None) is None  # no key configured: nothing required
    tampered = dict(signed, digest="cd" * 32)
    assert "bad signature" in signing.check(tampered, b"k1")


def test_redact_hides_passwords_everywhere():
    url = "rediss://writer:s3cr3t@cache.internal:6380/0?password=other&ssl_ca_certs=/ca.pem"
    shown = redact(url)
    assert "s3cr3t" not in shown and "other" not in shown
    assert "writer:***@cache.internal:6380" in shown and "ssl_ca_certs=/ca.pem" in shown
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert "s3cr3t" not in scrub(f"Error connecting to {url}: s3cr3t rejected", url)


def test_store_url_parsing():
    assert parse_store_url("redis://h:1/0").cluster is False
    assert parse_store_url("redis+cluster://h:7000").cluster is True
    parsed = parse_store_url("rediss://u:p@h:7000/0?cluster=true&ssl_ca_certs=/x")
    assert parsed.cluster and parsed.url.startswith("rediss://") and "cluster" not in parsed.url
    for bad in ("ftp://u:topsecret@h", "redis://", "redis://h:notaport", "unix+cluster://x"):
        with pytest.raises(WarmdInputError) as err:
            parse_store_url(bad)
        assert "topsecret" not in str(err.value)


def test_error_classification():
    import redis

    assert classify(redis.exceptions.NoPermissionError("no permissions to run 'set'")) == "denied"
    script = redis.exceptions.ResponseError("The user executing the script can't run this "
                                            "command or subcommand")
    assert classify(script) == "denied"
    assert classify(redis.exceptions.OutOfMemoryError("OOM command not allowed")) == "oom"
    assert classify(redis.exceptions.ReadOnlyError("READONLY You can't write")) == "readonly"
    assert classify(redis.exceptions.TimeoutError("Timeout reading")) == "down"
    assert classify(ConnectionRefusedError()) == "down"
    assert classify(redis.exceptions.AuthenticationError("invalid password")) == "auth"


def test_fingerprint_covers_what_decides_a_hit():
    h200, h20 = PRESETS["h200"], PRESETS["h20"]
    base = fingerprint_of("deep_gemm", {"version": "0.1.4"}, h200, "default", "13.0")
    assert base.inputs["sms"] == 132 and base.inputs["arch"] == "9.0a"
    assert base.inputs["driver_cuda_major"] == "13"
    variants = [
        fingerprint_of("deep_gemm", {"version": "0.1.4"}, h20, "default", "13.0"),  # SMs
        fingerprint_of("deep_gemm", {"version": "0.1.5"}, h200, "default", "13.0"),
        fingerprint_of("deep_gemm", {"version": "0.1.4"}, h200, "team-b", "13.0"),
        fingerprint_of("deep_gemm", {"version": "0.1.4"}, h200, "default", "12.8"),
        fingerprint_of("deep_gemm", {"version": "0.1.4", "install_path": "/opt/x"}, h200,
                       "default", "13.0"),
        fingerprint_of("flashinfer", {"version": "0.1.4"}, h200, "default", "13.0"),
    ]
    digests = {base.digest} | {v.digest for v in variants}
    assert len(digests) == len(variants) + 1
    # Same inputs, same digest, on any machine.
    assert fingerprint_of("deep_gemm", {"version": "0.1.4"}, h200, "default",
                          "13.0").digest == base.digest


def test_fingerprint_adapter_values_win_but_unknown_does_not_erase():
    gpu = Target("NVIDIA H200", (9, 0), 132, cuda="12.9")
    fp = fingerprint_of("flashinfer", {"arch": "90a", "sms": None, "library": "evil"}, gpu,
                        "default", "13.0")
    assert fp.inputs["arch"] == "90a" and fp.inputs["sms"] == 132
    assert fp.inputs["library"] == "flashinfer"
    # The driver's CUDA major comes from the GPU node, the toolkit's from nvcc.
    assert fp.inputs["driver_cuda_major"] == "12" and fp.inputs["cuda_toolkit"] == "13.0"


def _manifest(**kw) -> Manifest:
    data = {"library": "testlib", "name": "kernel.a.00", "fingerprint": "f" * 24,
            "digest": layout.sha256(b"x" * 10), "size": 10, "producer": "n1",
            "compile_seconds": 1.5, "created": 1.0}
    data.update(kw)
    return Manifest(**data)


def test_manifest_decoding_refuses_malformed_records():
    man = _manifest()
    assert Manifest.decode(man.encode(), 100) == man
    for raw in (b"not json", b"[1]", _manifest(name="../x").encode(),
                _manifest(digest="zz").encode(), _manifest(size=1000).encode(),
                _manifest(chunk_size=10).encode(), b'{"name": "a"}'):
        with pytest.raises(BadRecord):
            Manifest.decode(raw, 100)


def test_accept_manifest_checks_signature_and_identity():
    raw = json_bytes(signing.sign(_manifest().to_json(), b"k"))
    fp = "f" * 24
    assert accept_manifest(raw, key=b"k", max_size=100, fp=fp, name="kernel.a.00")
    with pytest.raises(SignatureRefused):
        accept_manifest(raw, key=b"other", max_size=100, fp=fp, name="kernel.a.00")
    with pytest.raises(BadRecord) as err:  # a valid manifest stored under another name
        accept_manifest(raw, key=b"k", max_size=100, fp=fp, name="kernel.b.00")
    assert not isinstance(err.value, SignatureRefused)


def test_blob_checks_and_chunking():
    blob = bytes(range(256)) * 9000  # 2.2 MiB: three chunks
    chunks = split_chunks(blob)
    assert [len(c) for c in chunks] == [1 << 20, 1 << 20, len(blob) - (2 << 20)]
    man = _manifest(digest=layout.sha256(blob), size=len(blob))
    assert man.chunks == 3
    assert check_blob(man, chunks) == blob
    with pytest.raises(BadRecord, match="missing chunk 1"):
        check_blob(man, [chunks[0], None, chunks[2]])
    with pytest.raises(BadRecord, match="truncated"):
        check_blob(man, [chunks[0], chunks[1], chunks[2][:-1]])
    flipped = bytearray(chunks[1])
    flipped[7] ^= 0x10
    with pytest.raises(BadRecord, match="digest mismatch"):
        check_blob(man, [chunks[0], bytes(flipped), chunks[2]])
    assert split_chunks(b"") == [b""] and _manifest(size=0).chunks == 1


def test_keys_of_one_entry_share_a_hash_slot():
    from redis.crc import key_slot

    fp, digest = "a" * 24, "b" * 64
    together = [layout.manifest_key(fp, "n"), layout.index_key(fp), layout.task_key(fp, "t/x"),
                layout.lease_key(fp, "t/x"), layout.quarantine_key(fp, "n"),
                layout.fp_meta_key(fp)]
    assert len({key_slot(k.encode()) for k in together}) == 1
    assert len({key_slot(layout.blob_key(digest, i).encode()) for i in range(5)}) == 1


def test_breaker_opens_probes_once_and_backs_off():
    now = [0.0]
    breaker = CircuitBreaker(cooldown=2.0, max_cooldown=5.0, clock=lambda: now[0])
    assert breaker.allow()
    breaker.failure()
    assert breaker.is_open and not breaker.allow()
    now[0] = 2.1
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one at a time
    breaker.failure()  # probe failed: cooldown doubles to 4 s
    now[0] = 5.0
    assert not breaker.allow()
    now[0] = 6.2
    assert breaker.allow()
    breaker.failure()  # capped at 5 s
    now[0] = 11.3
    assert breaker.allow()
    breaker.success()
    assert not breaker.is_open and breaker.allow() and breaker.opened == 1


@pytest.mark.parametrize("url, password", [
    ("redis://writer:abc/DEF+gh@cache.internal:6379/0", "abc/DEF+gh"),
    ("redis://:Se#cret@cache:6379/0", "Se#cret"),
    ("redis://tok?en@cache:6379/0", "tok?en"),
])
def test_redact_and_scrub_with_url_delimiters_in_the_password(url, password):
    assert password not in redact(url) and redact(url).endswith("@cache.internal:6379/0"
                                                                 if "internal" in url
                                                                 else "@cache:6379/0")
    assert password not in scrub(f"Error connecting to {url}: {password} refused", url)
    with pytest.raises(WarmdInputError) as raised:
        parse_store_url(url)
    assert password not in str(raised.value)


def test_unix_urls_keep_their_slashes_and_are_checked_by_redis_py():
    assert parse_store_url("unix:///tmp/x.sock?db=1").url == "unix:///tmp/x.sock?db=1"
    with pytest.raises(WarmdInputError, match="socket_timeout"):
        parse_store_url("unix:///tmp/x.sock?socket_timeout=abc")


def test_the_counter_table_is_the_one_source_of_counter_names():
    from dataclasses import fields

    from warmd import stats
    from warmd.cluster.state import KERNEL_COUNTS
    from warmd.executors.base import OUTCOMES
    from warmd.stats import CounterFlag
    from warmd.store.counters import STORE_OWNED, WARMUP_OWNED, StoreStats

    assert len(stats.BY_ID) == len(stats.COUNTERS)  # every id once
    assert [f.name for f in fields(stats.Counters)] == list(stats.ids(CounterFlag.RUN))
    assert {s.outcome for s in stats.select(CounterFlag.KERNEL)} == set(OUTCOMES)
    assert ("total", *stats.ids(CounterFlag.KERNEL)) == KERNEL_COUNTS
    assert not WARMUP_OWNED & STORE_OWNED and "corrupt_rejected" in STORE_OWNED
    counters = stats.Counters(local_hits=1, remote_hits=2, compiled=1)
    assert counters.kernel_counts() == {"total": 4, "local_hits": 1, "remote_hits": 2,
                                        "compiled": 1, "failed": 0}
    assert counters.hit_rate == 0.75 == stats.hit_rate(counters.to_json())
    assert stats.render_details({"store_errors": 3})[6] == f"{'Store errors':<26}{3:>12}"
    with pytest.raises(ValueError):  # a name not in the table is a bug, caught at once
        StoreStats("n").count("no_such_counter")
