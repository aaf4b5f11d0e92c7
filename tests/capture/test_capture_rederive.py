"""Provenance before signature: what a serving node captures is a pending claim that no node
installs, until a trusted producer re-derives it and publishes what it built itself.

Real parts: a real redis-server, real Triton sm_90 compiles and a real FlashInfer sm_90a
module build (the engine stand-ins), the capture on node A, a trusted producer's
re-derivation, and node C installing learned entries as a node does before READY.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from store_support import isolate_capture, module_server

from warmd.capture import Capture, CaptureScope, CaptureTrust, install_learned
from warmd.libraries.flashinfer_autotune.cache import FlashInferAutotuneAdapter
from warmd.libraries.triton.cache import TritonCacheAdapter
from warmd.rederive import Rederiver
from warmd.store import layout, open_shared_cache
from warmd.targets import preset

pytest.importorskip("triton")

from tests.triton_support import compile_add, snapshot  # noqa: E402

PLAN = "plan-rederive-0123456789abcdef"
KEY = b"cluster-key"
server = module_server()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_capture(monkeypatch, tmp_path, server)


def scope(base: Path) -> CaptureScope:
    return CaptureScope(PLAN, preset("h200").to_json(),
                        {"triton": str(base / "triton"), "flashinfer": str(base / "fi"),
                         "flashinfer_autotune": str(base / "vllm")})


def opener(server, node: str):
    return lambda target: open_shared_cache(server.url, target=target, node=node,
                                            signing_key=KEY)


def capture(server, base: Path, node: str = "node-a", **kw) -> Capture:
    """Node A's capture, scanned by the test alone (its own loop waits an hour)."""
    cap = Capture(node, [scope(base)], opener(server, node), inotify=False,
                  poll_seconds=3600, **kw)
    cap.start()
    assert cap.wait_started(120)
    return cap


def trusted(server, base: Path) -> Rederiver:
    """The trusted producer (node B), one pass at a time."""
    return Rederiver([scope(base)], opener(server, "node-b"))


def learned_on(server, base: Path, adapter) -> list[str]:
    """What node C installs before READY (the warmup's install_learned)."""
    with open_shared_cache(server.url, target=preset("h200"), node="node-c",
                           signing_key=KEY) as shared:
        return install_learned(shared, adapter, PLAN)


def clean_compile(cache: Path) -> None:
    """The add kernel compiled in a process of its own (this one may have loaded libraries
    that change what Triton emits: measured, a cubin differing in one byte)."""
    import subprocess
    import sys

    from store_support import SRC

    subprocess.run([sys.executable, "-m", "tests.triton_support", str(cache)], cwd=SRC,
                   check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": SRC})


def test_planted_cubin_host_module_and_autotune_json_are_never_installed_elsewhere(
        server, tmp_path):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    planted_cubin = os.urandom(6000)  # a modified cubin under a real kernel's key
    (entry.path / "add_kernel.cubin").write_bytes(planted_cubin)
    module = root / ("H" * 52)  # a planted host module: one .so, no source
    module.mkdir()
    (module / "cuda_utils.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF planted")
    autotune = FlashInferAutotuneAdapter(tmp_path / "a" / "vllm", arch="9.0a")
    tuned = autotune.vllm_dir / ("c" * 64) / "autotune_configs.json"
    tuned.parent.mkdir(parents=True)
    tuned.write_text(json.dumps({"configs": {"op": [1, 2]}}))
    a = capture(server, tmp_path / "a")  # rederive: the default
    try:
        assert a.counts["captured"] == {"triton": 2, "flashinfer_autotune": 1}
    finally:
        a.stop()
    c_triton = TritonCacheAdapter(tmp_path / "c" / "triton", arch="9.0a")
    assert learned_on(server, tmp_path / "c", c_triton) == []  # pending: installed nowhere
    assert c_triton.list_entries() == []
    client = server.client()
    assert not list(client.scan_iter(match="warmd:v1:man:*"))  # nothing installable
    assert len(list(client.scan_iter(match="warmd:v1:claim:*"))) == 3

    b = trusted(server, tmp_path / "b")
    outcomes = {(r.library, r.name): r for r in b.run_once()}
    assert outcomes[("triton", module.name)].outcome == "refused"
    rebuilt = outcomes[("triton", entry.name)]
    assert rebuilt.outcome == "rederived" and not rebuilt.identical
    assert "add_kernel.cubin" in rebuilt.why
    assert outcomes[("flashinfer_autotune", f"vllm-{'c' * 64}")].outcome == "rederived"
    assert not list(client.scan_iter(match="warmd:v1:claim*"))  # every claim settled

    assert learned_on(server, tmp_path / "c", c_triton) == [entry.name]
    cubin = (c_triton.root / entry.name / "add_kernel.cubin").read_bytes()
    assert cubin != planted_cubin  # what C got is what B compiled from the IR
    clean_compile(tmp_path / "fresh")  # what Triton makes of the kernel in a clean process
    (fresh,) = TritonCacheAdapter(tmp_path / "fresh").list_entries()
    assert cubin == (fresh.path / "add_kernel.cubin").read_bytes()
    assert not (c_triton.root / module.name).exists()


def test_a_claim_whose_ir_links_outside_triton_or_lies_about_its_key_is_refused(
        server, tmp_path):
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    meta = json.loads((entry.path / "add_kernel.json").read_text())
    meta["hash"] = "0" * 64  # another key than the directory's
    (entry.path / "add_kernel.json").write_text(json.dumps(meta))
    compile_add(root, block=64)
    other = next(e for e in TritonCacheAdapter(root).list_entries() if e.name != entry.name)
    ttir = other.path / "add_kernel.ttir"
    ttir.write_text(ttir.read_text().replace(
        "module {", 'module {\n  // libpath = "/etc/evil.bc"', 1))
    a = capture(server, tmp_path / "a")
    a.stop()
    results = {r.name: r for r in trusted(server, tmp_path / "b").run_once()}
    assert results[entry.name].outcome == "refused" and "key" in results[entry.name].why
    assert results[other.name].outcome == "refused" and "bitcode" in results[other.name].why
    assert learned_on(server, tmp_path / "c",
                      TritonCacheAdapter(tmp_path / "c" / "triton", arch="9.0a")) == []


def test_with_trust_off_nothing_is_shared_and_with_own_nodes_it_is_published_signed(
        server, tmp_path):
    compile_add(tmp_path / "a" / "triton")
    off = capture(server, tmp_path / "a", trust=CaptureTrust.OFF)
    off.stop()
    shared = {k.decode() for k in server.client().scan_iter(match="warmd:*")}
    assert off.total("captured") == 0 and not shared - {layout.KEY_PROOF_KEY}  # (the store's)
    own = capture(server, tmp_path / "a", trust=CaptureTrust.OWN_NODES)
    own.stop()
    assert own.total("captured") == 1
    assert not list(server.client().scan_iter(match="warmd:v1:claim*"))
    dest = TritonCacheAdapter(tmp_path / "c" / "triton", arch="9.0a")
    assert len(learned_on(server, tmp_path / "c", dest)) == 1


def test_an_entry_that_flaps_is_counted_as_runtime_jit_once(server, tmp_path):
    root = tmp_path / "a" / "triton"
    a = capture(server, tmp_path / "a")
    try:
        compile_add(root)
        (entry,) = TritonCacheAdapter(root).list_entries()
        assert [e.entry for e in a.scan()] == [entry.name]
        aside = tmp_path / "aside"
        for _ in range(3):  # gone, back, gone, back...
            shutil.move(entry.path, aside)
            assert a.scan() == []
            shutil.move(aside, entry.path)
            assert a.scan() == []
        assert a.counts["runtime_jit"] == {"triton": 1}
        assert a.counts["captured"] == {"triton": 1}  # claimed once, too
    finally:
        a.stop()


def test_an_error_in_one_entry_is_counted_and_the_scan_goes_on(server, tmp_path,
                                                               monkeypatch):
    root = tmp_path / "a" / "triton"
    a = capture(server, tmp_path / "a")
    try:
        compile_add(root)
        compile_add(root, block=64)
        first = sorted(e.name for e in TritonCacheAdapter(root).list_entries())[0]
        real_pack = TritonCacheAdapter.pack

        def pack(self, entry):
            if entry.name == first:
                raise KeyError("a library's surprise")
            return real_pack(self, entry)

        monkeypatch.setattr(TritonCacheAdapter, "pack", pack)
        assert len(a.scan()) == 2
        assert a.counts["capture_failed"] == {"triton": 1}
        assert a.counts["captured"] == {"triton": 1}
    finally:
        a.stop()


def engine(base: Path) -> None:
    """The engine on a node: a Triton kernel and a FlashInfer module compiled in a process
    of its own, into that node's caches."""
    import subprocess
    import sys

    from store_support import SRC

    subprocess.run([sys.executable, "-m", "tests.capture_engine"], cwd=SRC, check=True,
                   capture_output=True, timeout=900,
                   env={**os.environ, "PYTHONPATH": SRC, "TRITON_CACHE_DIR": str(base / "triton"),
                        "FLASHINFER_WORKSPACE_BASE": str(base / "fi")})


@pytest.mark.slow
def test_real_compiles_after_ready_reach_the_next_node_through_the_re_derivation(
        server, tmp_path):
    pytest.importorskip("flashinfer")
    base_a = tmp_path / "a"
    a = capture(server, base_a)
    try:
        engine(base_a)
        events = a.scan()
        assert sorted(e.library for e in events) == ["flashinfer", "triton"]
        assert a.counts["captured"] == {"triton": 1, "flashinfer": 1}
    finally:
        a.stop()
    began = time.monotonic()
    results = trusted(server, tmp_path / "b").run_once()
    seconds = time.monotonic() - began
    assert {(r.library, r.outcome) for r in results} == {("triton", "rederived"),
                                                          ("flashinfer", "rederived")}
    identical = {r.library: r.identical for r in results}
    print(f"re-derived in {seconds:.1f}s; byte-identical: {identical}; "
          f"differs: {[r.why for r in results if not r.identical]}")
    assert identical["triton"]  # FlashInfer's never is: docs/redis.md, "The capture path"

    from warmd.capture import adapters_for

    c = adapters_for(scope(tmp_path / "c"))
    names = {lib: learned_on(server, tmp_path / "c", c[lib]) for lib in ("triton", "flashinfer")}
    assert all(len(v) == 1 for v in names.values()), names
    caches = [tmp_path / "c" / "triton", tmp_path / "c" / "fi" / ".cache" / "flashinfer"]
    before = [snapshot(p) for p in caches]
    engine(tmp_path / "c")
    changed = [sorted(k for k, v in snapshot(p).items() if before[i].get(k) != v
                      and not k.endswith("flashinfer_jit.log")) for i, p in enumerate(caches)]
    assert changed == [[], []]  # C compiled nothing: both were installed, and they hit
    client = server.client()
    signed = [client.get(k) for k in client.scan_iter(match="warmd:v1:man:*")]
    assert len(signed) == 2 and all(b'"sig"' in m for m in signed)
    assert all(layout.Manifest.decode(m, 1 << 30).producer == "node-b" for m in signed)


TINY_IMPL = """#pragma once
namespace deep_gemm {
template <int kScale>
__global__ void tiny_scale(float* x) { x[threadIdx.x] *= kScale; }
}
"""


def _dg_entry(root: Path, name: str, source: str, cubin: bytes) -> Path:
    entry = root / "cache" / name
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_text(source)
    (entry / "kernel.cubin").write_bytes(cubin)
    return entry


def test_deep_gemm_kernels_are_recompiled_with_this_nodes_command_and_code_is_refused(
        tmp_path):
    """Real nvcc (sm_90a cubins need no GPU) on a DeepGEMM-form kernel.cu whose header is a
    stand-in for DeepGEMM's: the claimed cubin is replaced by this node's compile, and a
    kernel.cu carrying code of its own is refused before anything is compiled."""
    from warmd import settings
    from warmd.cache.rederived import RederiveRefused
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
    from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE
    from warmd.libraries.deep_gemm.rederive import rederive

    nvcc = settings.cuda_home() / "bin" / "nvcc"
    if not nvcc.exists():
        pytest.skip("no nvcc")
    include = tmp_path / "include"
    (include / "deep_gemm" / "impls").mkdir(parents=True)
    (include / "deep_gemm" / "impls" / "tiny.cuh").write_text(TINY_IMPL)
    template = [SOURCE, "-cubin", "-o", OUTPUT, f"-I{include}", "-std=c++17",
                "--gpu-architecture=sm_90a"]
    source = ("// Includes' hash value: 0123\n\n#include <deep_gemm/impls/tiny.cuh>\n\n"
              "using namespace deep_gemm;\n\nstatic void __instantiate_kernel() {\n"
              "    auto ptr = reinterpret_cast<void*>(&tiny_scale<\n        3\n    >);\n};\n")
    adapter = DeepGemmCacheAdapter(tmp_path / "a", arch="9.0a", sms=132)
    name = "kernel.tiny_scale." + "ab" * 16
    _dg_entry(adapter.root, name, source, b"planted cubin")
    (entry,) = adapter.list_entries()
    got = rederive(adapter, name, adapter.pack(entry), tmp_path / "b", template)
    assert not got.identical and got.differs == ("kernel.cubin",)
    honest = DeepGemmCacheAdapter(tmp_path / "c", arch="9.0a", sms=132)
    installed = honest.install(name, got.artifact)
    cubin = (installed.path / "kernel.cubin").read_bytes()
    assert cubin.startswith(b"\x7fELF") and cubin != b"planted cubin"
    again = rederive(honest, name, honest.pack(installed), tmp_path / "d", template)
    assert again.identical  # nvcc reproduces its own cubin byte for byte
    evil = source.replace("using namespace deep_gemm;", "__global__ void steal() {}")
    planted = DeepGemmCacheAdapter(tmp_path / "e", arch="9.0a", sms=132)
    _dg_entry(planted.root, name, evil, cubin)
    (bad,) = planted.list_entries()
    with pytest.raises(RederiveRefused, match="beyond DeepGEMM's includes"):
        rederive(planted, name, planted.pack(bad), tmp_path / "f", template)
