"""What an engine process can plant in a watched cache directory, read by the capture as an
attacker's filesystem: nothing blocks it, nothing outside the cache is read, nothing over the
limits is held, one bad entry never stops a scan and each is counted, never published. And
JSON out of bounds in a stored entry is refused at install (quarantined), not a failure.

Real parts: a real redis-server, real Triton sm_90 compiles (the engine stand-in), FlashInfer's
own autotune writer, real FIFOs, symlinks and sparse files.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_support import SRC, isolate_capture, module_server

from warmd.cache.base import CacheEntry, UnsafeArtifact
from warmd.cache.install import unpack_safely
from warmd.cache.packing import pack_directory
from warmd.capture.scope import CaptureScope, adapters_for
from warmd.capture.sharing import verify_for_publishing
from warmd.capture.watch import Capture
from warmd.libraries.triton.cache import TritonCacheAdapter
from warmd.store import layout, open_shared_cache
from warmd.targets import preset

pytest.importorskip("triton")

from tests.triton_support import compile_add  # noqa: E402

PLAN = "plan-hostile-0123456789abcdef"
DEEP = b"[" * 100_000 + b"]" * 100_000  # json.loads: RecursionError
server = module_server()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_capture(monkeypatch, tmp_path, server, flashinfer_workspace="fi")


def _scope(base: Path) -> CaptureScope:
    return CaptureScope(PLAN, preset("h200").to_json(),
                        {"triton": str(base / "triton"), "flashinfer_autotune": str(base / "vllm")})


def _capture(server, base: Path) -> Capture:
    return Capture("node-a", [_scope(base)], lambda target: open_shared_cache(
        server.url, target=target, node="node-a"), inotify=False)


def _start_within(cap: Capture, seconds: float, fifos: list[Path]) -> None:
    """cap.start(), which returns at once (the scan runs in the capture's thread); its scan
    on start must finish within seconds. One blocked on a FIFO is released (a writer opens
    and closes it) so that the test fails instead of hanging."""
    began = time.monotonic()
    cap.start()
    assert time.monotonic() - began < 1.0, "Capture.start() blocked its caller"
    if not cap.wait_started(seconds):
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        cap.wait_started(10)
        pytest.fail(f"the capture's scan on start was still blocked after {seconds}s")


def _published_bytes(server) -> bytes:
    """Everything the store holds, blobs unpacked: what a secret would have to be in."""
    client = server.client()
    out = []
    for key in client.scan_iter(match="warmd:*"):
        if client.type(key) != b"string":
            continue
        value = client.get(key)
        out.append(value)
        if value[:2] == b"\x1f\x8b":
            out.append(gzip.decompress(value))
    return b"\n".join(out)


def test_a_fifo_named_like_a_triton_group_file_does_not_stop_the_capture(server, tmp_path):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    planted = root / ("F" * 52)
    planted.mkdir()
    os.mkfifo(planted / "__grp__add_kernel.json")
    cubin_fifo = root / ("G" * 52)  # a complete-looking entry whose cubin is a FIFO
    cubin_fifo.mkdir()
    os.mkfifo(cubin_fifo / "add_kernel.cubin")
    (cubin_fifo / "__grp__add_kernel.json").write_text(json.dumps(
        {"child_paths": {"add_kernel.cubin": str(cubin_fifo / "add_kernel.cubin")}}))
    cap = _capture(server, tmp_path / "a")
    try:
        _start_within(cap, 20, [planted / "__grp__add_kernel.json",
                                cubin_fifo / "add_kernel.cubin"])
        assert cap.counts["captured"] == {"triton": 1}  # the real compile still travels
        assert cap.counts["capture_refused"] == {"triton": 2}
        assert cap.scan() == [] and cap.total("capture_refused") == 2
    finally:
        cap.stop()


def test_deep_or_nan_autotune_json_and_failed_hash_checks_are_refused_and_counted(
        server, tmp_path):
    from flashinfer.autotuner import AutoTuner

    adapter = adapters_for(_scope(tmp_path / "a"))["flashinfer_autotune"]
    good = adapter.vllm_dir / ("a" * 64) / "autotune_configs.json"
    good.parent.mkdir(parents=True)
    AutoTuner.get().save_configs(str(good))  # FlashInfer's own writer
    for digest, content in (("d" * 64, DEEP), ("e" * 64, b'{"tactic": NaN}')):
        (adapter.vllm_dir / digest).mkdir()
        (adapter.vllm_dir / digest / "autotune_configs.json").write_bytes(content)
    forged = adapter.v2_dir / ("1" * 16)  # the op file's name is not its key's digest
    (forged / "entries").mkdir(parents=True)
    (forged / "manifest.json").write_text(json.dumps({"gpu": "H200"}))
    (forged / "entries" / ("2" * 24 + ".json")).write_text(json.dumps({"key": "another op"}))
    listed = sorted(e.name for e in adapter.list_entries())  # no RecursionError
    assert listed == sorted([f"v2-{'1' * 16}-{'2' * 24}", f"vllm-{'a' * 64}",
                             f"vllm-{'d' * 64}", f"vllm-{'e' * 64}"])
    cap = _capture(server, tmp_path / "a")
    try:
        _start_within(cap, 30, [])
        assert cap.counts["captured"] == {"flashinfer_autotune": 1}
        assert cap.counts["capture_refused"] == {"flashinfer_autotune": 3}
        (adapter.vllm_dir / ("f" * 64)).mkdir()  # later entries are still seen
        (adapter.vllm_dir / ("f" * 64) / "autotune_configs.json").write_bytes(DEEP)
        assert [e.entry for e in cap.scan()] == [f"vllm-{'f' * 64}"]
        assert cap.total("capture_refused") == 4 and cap.total("captured") == 1
    finally:
        cap.stop()
    assert b"another op" not in _published_bytes(server)


def test_a_sparse_cubin_is_refused_before_it_is_read(server, tmp_path, monkeypatch):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    with open(entry.path / "add_kernel.cubin", "r+b") as fh:
        fh.truncate(1 << 30)  # 1 GiB long, a few KB on disk
    assert (entry.path / "add_kernel.cubin").stat().st_blocks * 512 < 1 << 20
    why = verify_for_publishing(TritonCacheAdapter(root), entry)
    assert why is not None and "over the" in why and "1073741824 bytes" in why
    cap = _capture(server, tmp_path / "a")
    try:
        _start_within(cap, 30, [])
        assert cap.counts["capture_refused"] == {"triton": 1} and cap.total("captured") == 0
    finally:
        cap.stop()


def test_packing_a_sparse_cubin_costs_no_memory(tmp_path):
    """The issue's measurement: a 1 GiB sparse cubin made a packing process 1.1 GB larger.
    Packed in a process of its own, whose peak RSS is then read."""
    entry = tmp_path / "cache" / "kernel.sm90_fp8_gemm_1d2d.0123456789abcdef"
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_text("// generated\n")
    with open(entry / "kernel.cubin", "wb") as fh:
        fh.truncate(1 << 30)
    code = """
import sys
from pathlib import Path
from warmd.cache.base import CacheEntry, UnsafeArtifact
from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
adapter = DeepGemmCacheAdapter(Path(sys.argv[1]), arch="9.0a", sms=132)
(entry,) = adapter.list_entries()
try:
    adapter.pack(entry)
    outcome = "packed"
except UnsafeArtifact as exc:
    outcome = f"refused: {exc}"
# VmHWM: this process's own peak (ru_maxrss would include the forking parent's)
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
print(peak_kib // 1024, outcome)
"""
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": SRC},
                          check=True)
    peak_mib, outcome = proc.stdout.split(" ", 1)
    print(f"packing a 1 GiB sparse cubin: peak RSS {peak_mib} MiB, {outcome.strip()}")
    assert outcome.startswith("refused") and "over the" in outcome
    assert int(peak_mib) < 300


def _forged(artifact: bytes, tmp_path: Path, member: str, content: bytes) -> bytes:
    unpacked = tmp_path / "forged"
    unpack_safely(artifact, unpacked)
    (unpacked / member).write_bytes(content)
    return pack_directory(unpacked)


class _Writer(TritonCacheAdapter):
    """A writer publishing what it likes under a real entry's name (with signing off any
    writer can): its pack returns the forged artifact."""

    def __init__(self, root: Path, artifact: bytes) -> None:
        super().__init__(root, arch="9.0a")
        self.artifact = artifact

    def pack(self, entry: CacheEntry) -> bytes:
        return self.artifact


@pytest.mark.parametrize("member", ["__grp__add_kernel.json", "add_kernel.json"])
def test_deep_json_in_a_stored_triton_entry_is_refused_and_quarantined(server, tmp_path,
                                                                       member):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    source = TritonCacheAdapter(root, arch="9.0a")
    (entry,) = source.list_entries()
    forged = _forged(source.pack(entry), tmp_path, member, DEEP)
    with pytest.raises(UnsafeArtifact, match="deeper"):  # not a RecursionError
        TritonCacheAdapter(tmp_path / "unit", arch="9.0a").install(entry.name, forged)
    target = preset("h200")
    with open_shared_cache(server.url, target=target, node="writer") as writer:
        writer.entries.publish_task(_Writer(root, forged), "task", [entry], 1.0)
        fp = writer.fingerprint(source).digest
    dest = TritonCacheAdapter(tmp_path / "b" / "triton", arch="9.0a")
    with open_shared_cache(server.url, target=target, node="reader") as reader:
        assert reader.entries.fetch_task(dest, "task") is None
        counts = dict(reader.stats.counters)
    assert counts.get("unsafe_rejected") == 1 and counts.get("quarantined") == 1, counts
    assert "install_failed" not in counts
    assert dest.list_entries() == []
    client = server.client()
    assert not client.exists(layout.manifest_key(fp, entry.name))
    assert client.exists(layout.quarantine_key(fp, entry.name))
