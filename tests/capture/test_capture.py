"""Capture on one node and install on another, with a real redis-server and real Triton
sm_90 compiles as the engine (no Ray: the daemon test is tests/capture/test_capture_cluster.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from store_support import isolate_capture, start_test_server

from warmd.capture.scope import CaptureScope, adapters_for
from warmd.capture.sharing import install_learned, learned_task
from warmd.capture.watch import Capture, CaptureTrust
from warmd.libraries.triton.cache import TritonCacheAdapter
from warmd.store import open_shared_cache
from warmd.targets import preset

pytest.importorskip("triton")

from tests.triton_support import capture_compile_add, compile_add, snapshot  # noqa: E402

PLAN = "plan-llama-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_test_server(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_capture(monkeypatch, tmp_path, server)


def scope(base: Path) -> CaptureScope:
    return CaptureScope(PLAN, preset("h200").to_json(), {"triton": str(base / "triton")})


def capture(server, base: Path, node: str, trust=CaptureTrust.OWN_NODES, **kw) -> Capture:
    """A capture publishing learned entries itself (a cluster trusting its own nodes; the
    default, re-derivation, is tests/capture/test_capture_rederive.py's)."""
    events = []
    cap = Capture(node, [scope(base)], lambda target: open_shared_cache(
        server.url, target=target, node=node), on_runtime_jit=events.append, trust=trust,
        **kw)
    cap.seen = events
    return cap


def test_adapters_for_a_scope_cover_every_installed_library(tmp_path):
    found = adapters_for(scope(tmp_path))
    assert {"triton", "flashinfer_autotune"} <= set(found)
    assert found["triton"].root == tmp_path / "triton"


def test_a_kernel_compiled_after_ready_is_counted_published_and_installed_elsewhere(
        server, tmp_path):
    a = capture(server, tmp_path / "a", "node-a", inotify=False)
    a.start()
    assert a.wait_started(60)
    try:
        compile_add(tmp_path / "a" / "triton")
        (event,) = a.scan()
        assert (event.library, event.node) == ("triton", "node-a")
        assert a.seen == [event] and a.counts["runtime_jit"] == {"triton": 1}
        assert a.counts["captured"] == {"triton": 1} and a.total("capture_refused") == 0
        assert a.scan() == []  # counted once
    finally:
        a.stop()
    b_root = tmp_path / "b" / "triton"
    adapter = TritonCacheAdapter(b_root, arch="9.0a")
    with open_shared_cache(server.url, target=preset("h200"), node="node-b") as shared:
        assert shared.lists.learned(adapter, PLAN) == [event.entry]
        assert install_learned(shared, adapter, PLAN) == [event.entry]
        assert shared.stats.counters["remote_hits"] == 1
    shutil.rmtree(tmp_path / "a")  # the first node's paths are gone: only b's copy is there
    before = snapshot(b_root)
    compile_add(b_root)
    assert snapshot(b_root) == before  # the same compile on b: a hit, no new entry
    b = capture(server, tmp_path / "b", "node-b", inotify=False)
    b.start()  # b's entry is already learned: the scan on start publishes nothing new
    assert b.wait_started(60)
    try:
        assert b.scan() == [] and b.total("captured") == 0
    finally:
        b.stop()


def test_watcher_sees_a_compile_within_seconds_and_partial_entries_never(server, tmp_path):
    root = tmp_path / "a" / "triton"
    a = capture(server, tmp_path / "a", "node-a")
    a.start()
    assert a.wait_started(60)
    try:
        assert a.mode == "inotify"
        assert not root.exists()  # the engine's directory: watched once it appears
        root.mkdir(parents=True)
        partial = root / ("C" * 52)
        partial.mkdir(parents=True)
        (partial / "add_kernel.cubin").write_bytes(b"half")  # no group file yet
        time.sleep(1.0)
        assert a.seen == [] and a.total("captured") == 0
        started = time.monotonic()
        compile_add(root, block=64)
        while not a.seen and time.monotonic() - started < 10:
            time.sleep(0.1)
        assert [e.library for e in a.seen] == ["triton"], a.counts
        assert a.seen[0].entry != partial.name
        print(f"runtime JIT seen {time.monotonic() - started:.2f}s after the compile started")
    finally:
        a.stop()
    with open_shared_cache(server.url, target=preset("h200"), node="x") as shared:
        assert shared.lists.learned(TritonCacheAdapter(root, "9.0a"), PLAN) == [a.seen[0].entry]


def test_unsafe_entries_are_refused_and_counted_never_published(server, tmp_path,
                                                                 monkeypatch):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    cubin = entry.path / "add_kernel.cubin"
    outside = tmp_path / "outside.cubin"
    shutil.move(cubin, outside)
    os.symlink(outside, cubin)  # complete for Triton, not something to ship
    a = capture(server, tmp_path / "a", "node-a", inotify=False)
    a.start()  # the scan on start looks at it too
    assert a.wait_started(60)
    try:
        assert a.counts["capture_refused"] == {"triton": 1} and a.total("captured") == 0
        compile_add(root, block=512)
        new = [e for e in TritonCacheAdapter(root).list_entries() if e.name != entry.name]
        (new[0].path / "add_kernel.cubin").write_bytes(os.urandom(2 << 20))  # oversize
        monkeypatch.setenv("WARMD_MAX_ARTIFACT_BYTES", str(1 << 20))
        assert [e.entry for e in a.scan()] == [new[0].name]  # still a runtime JIT
        assert a.total("capture_refused") == 2 and a.total("captured") == 0
    finally:
        a.stop()
    with open_shared_cache(server.url, target=preset("h200"), node="x") as shared:
        assert shared.lists.learned(TritonCacheAdapter(root), PLAN) == []
        assert shared.entries.fetch_task(TritonCacheAdapter(tmp_path / "c"),
                                 learned_task(PLAN, entry.name)) is None


def test_a_restarted_watcher_loses_nothing_and_deleted_entries_count_again(server, tmp_path):
    root = tmp_path / "a" / "triton"
    compile_add(root)  # compiled while no watcher ran
    a = capture(server, tmp_path / "a", "node-a", inotify=False)
    a.start()
    assert a.wait_started(60)
    try:
        assert a.seen == [] and a.total("captured") == 1  # published by the scan on start
        (entry,) = TritonCacheAdapter(root).list_entries()
        shutil.rmtree(entry.path)  # the engine (or an operator) deletes it
        assert a.scan() == []
        compile_add(root)  # compiled again in traffic: a miss again
        assert [e.entry for e in a.scan()] == [entry.name]
        assert a.counts["runtime_jit"] == {"triton": 1}
    finally:
        a.stop()


def test_learned_entries_are_signed_when_signing_is_on(server, tmp_path):
    root = tmp_path / "a" / "triton"
    a = Capture("node-a", [scope(tmp_path / "a")], lambda target: open_shared_cache(
        server.url, target=target, node="node-a", signing_key=b"cluster-key"), inotify=False,
        trust=CaptureTrust.OWN_NODES)
    event = capture_compile_add(a, root)
    record = server.client().get(next(iter(server.client().scan_iter(
        match=f"*task:*{learned_task(PLAN, event.entry)}"))))
    assert b'"sig"' in record
    for key, installed in ((b"cluster-key", [event.entry]), (b"another-key", [])):
        dest = TritonCacheAdapter(tmp_path / key.decode() / "triton", arch="9.0a")
        with open_shared_cache(server.url, target=preset("h200"), node="node-b",
                               signing_key=key) as shared:
            assert install_learned(shared, dest, PLAN) == installed
            refused = shared.stats.counters.get("signature_rejected", 0)
        assert [e.name for e in dest.list_entries()] == installed
        assert refused == (0 if installed else 1)


def test_entries_the_store_did_not_take_are_published_later_and_counted_once(tmp_path):
    from warmd.store import free_port

    root = tmp_path / "a" / "triton"
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: publishing fails
    a = Capture("node-a", [scope(tmp_path / "a")], lambda target: open_shared_cache(
        down, target=target, node="node-a"), inotify=False)
    a.start()
    assert a.wait_started(60)
    try:
        compile_add(root)
        (event,) = a.scan()
        (triton,) = [w for w in a._watched if w.library == "triton"]
        assert a.total("captured") == 0 and triton.retry == {event.entry}
        assert a.scan() == []  # tried again, not counted again
        assert a.counts["runtime_jit"] == {"triton": 1}
    finally:
        a.stop()
