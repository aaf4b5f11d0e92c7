"""Provenance before signature: what a serving node captures is a pending capture that no node
installs, until a trusted producer re-derives it and publishes what it built itself.

Real parts: a real redis-server, real Triton sm_90 compiles and a real FlashInfer sm_90a
module build (the engine stand-ins), the capture on node A, a trusted producer's
re-derivation, and node C installing learned entries as a node does before READY.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from capture_support import KEY, PLAN, isolate_rederive, opener, published_values, scope
from store_support import module_server

from warmd.capture.sharing import install_learned
from warmd.capture.watch import Capture, CaptureTrust
from warmd.context import NodeContext
from warmd.libraries.flashinfer_autotune.cache import FlashInferAutotuneAdapter
from warmd.libraries.triton.cache import TritonCacheAdapter
from warmd.rederive import Rederiver
from warmd.store import layout, open_shared_cache
from warmd.store.formats import Manifest
from warmd.targets import preset

pytest.importorskip("triton")

from tests.triton_support import compile_add, snapshot  # noqa: E402

server = module_server()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_rederive(monkeypatch, tmp_path, server)


def capture(server, base: Path, node: str = "node-a", **kw) -> Capture:
    """Node A's capture, scanned by the test alone (its own loop waits an hour)."""
    cap = Capture(node, [scope(base)], opener(server, node), inotify=False,
                  poll_seconds=3600, **kw)
    cap.start()
    assert cap.wait_started(120)
    return cap


def trusted(server, base: Path) -> Rederiver:
    """The trusted producer (node B), one pass at a time."""
    return Rederiver([scope(base)], opener(server, "node-b"), NodeContext.of())


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
    assert not list(client.scan_iter(match="warmd:v1:claim*"))  # every capture settled

    assert learned_on(server, tmp_path / "c", c_triton) == [entry.name]
    cubin = (c_triton.root / entry.name / "add_kernel.cubin").read_bytes()
    assert cubin != planted_cubin  # what C got is what B compiled from its own function
    clean_compile(tmp_path / "fresh")  # what Triton makes of the kernel in a clean process
    (fresh,) = TritonCacheAdapter(tmp_path / "fresh").list_entries()
    assert cubin == (fresh.path / "add_kernel.cubin").read_bytes()
    assert not (c_triton.root / module.name).exists()


def test_a_capture_that_lies_about_its_key_is_refused_and_ir_it_brings_is_never_compiled(
        server, tmp_path):
    """A capture whose metadata names another key than its directory is refused; one whose
    IR names a bitcode library of the attacker's is re-derived from the library's function,
    and the IR it brought is in nothing published."""
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    meta = json.loads((entry.path / "add_kernel.json").read_text())
    meta["hash"] = "0" * 64  # another key than the directory's
    (entry.path / "add_kernel.json").write_text(json.dumps(meta))
    compile_add(root, block=64)
    other = next(e for e in TritonCacheAdapter(root).list_entries() if e.name != entry.name)
    for stage in ("ttir", "source"):
        ir = other.path / f"add_kernel.{stage}"
        ir.write_text(ir.read_text().replace(
            "module {", 'module {\n  // libpath = "/etc/evil.bc"', 1))
    a = capture(server, tmp_path / "a")
    a.stop()
    results = {r.name: r for r in trusted(server, tmp_path / "b").run_once()}
    assert results[entry.name].outcome == "refused" and "key" in results[entry.name].why
    assert results[other.name].outcome == "rederived"
    assert "add_kernel.ttir" in results[other.name].why  # the capture's IR is not published
    c = TritonCacheAdapter(tmp_path / "c" / "triton", arch="9.0a")
    assert learned_on(server, tmp_path / "c", c) == [other.name]
    assert not any(b"evil.bc" in value for value in published_values(server))


def rogue_entry(cache: Path, kernel: str) -> Path:
    """An entry compiled from tests/triton_rogue.py (no allow-list names it) into cache,
    in a process of its own."""
    import subprocess

    from store_support import SRC

    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from tests.triton_support import compile_add; "
                    f"compile_add(Path(sys.argv[1]), module='tests.triton_rogue', "
                    f"kernel={kernel!r})", str(cache)],
                   cwd=SRC, check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": SRC})
    return next(e.path for e in TritonCacheAdapter(cache).list_entries()
                if e.path.joinpath(f"{kernel}.json").exists())


def produce(server, tmp_path: Path) -> tuple[list, list]:
    """Node A captures what its Triton cache holds; node B re-derives it once: (its
    results, the counters it counted)."""
    a = capture(server, tmp_path / "a")
    a.stop()
    counts: list[tuple[str, str, int]] = []
    producer = Rederiver([scope(tmp_path / "b")], opener(server, "node-b"), NodeContext.of(),
                         on_count=lambda *c: counts.append(c))
    return producer.run_once(), counts


def test_other_code_under_the_library_kernels_name_is_quarantined(server, tmp_path):
    """An entry of a function of the attacker's named like the library's kernel (its IR,
    source and key all its own): no specialisation of the producer's own add_kernel has
    its key, so it is quarantined and counted; ae15aac's branch compiled its IR."""
    rogue = rogue_entry(tmp_path / "a" / "triton", "add_kernel")
    (result,), counts = produce(server, tmp_path)
    assert (result.name, result.outcome) == (rogue.name, "quarantined"), result
    assert counts == [("rederive_quarantined", "triton", 1)]
    assert not list(server.client().scan_iter(match="warmd:v1:man:*"))  # nothing published
    assert not server.client().keys("warmd:v1:claim*")


def test_tampered_ir_under_a_real_key_is_replaced_by_the_library_functions_compile(
        server, tmp_path):
    """The library kernel's real key and metadata, with every stage (source, IR, PTX,
    cubin) of other code: the producer compiles its own add_kernel for that key, so the
    node after it gets the library's cubin, never the capture's."""
    root = tmp_path / "a" / "triton"
    compile_add(root)
    (entry,) = TritonCacheAdapter(root).list_entries()
    rogue = rogue_entry(tmp_path / "rogue", "add_kernel")
    for stage in ("source", "ttir", "ttgir", "llir", "ptx", "cubin"):
        shutil.copy(rogue / f"add_kernel.{stage}", entry.path / f"add_kernel.{stage}")
    (result,), _counts = produce(server, tmp_path)
    assert (result.name, result.outcome) == (entry.name, "rederived"), result
    c = TritonCacheAdapter(tmp_path / "c" / "triton", arch="9.0a")
    assert learned_on(server, tmp_path / "c", c) == [entry.name]
    clean_compile(tmp_path / "fresh")
    (fresh,) = TritonCacheAdapter(tmp_path / "fresh").list_entries()
    for stage in ("source", "ttir", "cubin"):
        got = (c.root / entry.name / f"add_kernel.{stage}").read_bytes()
        assert got == (fresh.path / f"add_kernel.{stage}").read_bytes(), stage
        assert got != (rogue / f"add_kernel.{stage}").read_bytes(), stage


def test_a_real_flashinfer_triton_kernel_is_re_derived_from_the_default_allow_list(
        tmp_path, monkeypatch):
    """FlashInfer's own rms_norm_kernel (ten constexprs: None and 1 arguments, a float eps,
    a block size, four flags), compiled by an engine stand-in as Triton's launcher
    specialises it: the producer, with the default allow-list, finds the function in its
    installed FlashInfer, the specialisation whose key is the capture's, and compiles it:
    every file byte for byte the engine's."""
    import subprocess

    from store_support import SRC

    from warmd.cache.rederived import private_dir
    from warmd.libraries.triton.rederive import rederive

    pytest.importorskip("flashinfer")
    monkeypatch.delenv("WARMD_TRITON_MODULES")
    cache = tmp_path / "engine"
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from tests.triton_support import compile_flashinfer_rms_norm as c; "
                    "c(Path(sys.argv[1]))", str(cache)],
                   cwd=SRC, check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": SRC})
    adapter = TritonCacheAdapter(cache, arch="9.0a")
    (entry,) = adapter.list_entries()
    got = rederive(adapter, entry.name, adapter.pack(entry), private_dir("p-", tmp_path))
    assert got.identical, got.differs


def test_a_kernel_no_allow_listed_module_defines_stays_local(server, tmp_path):
    """A kernel whose function is in no module of the producer's allow-list: refused with
    the reason, counted, nothing published (its entry stays on the node that built it);
    `warmd plan` and `status` say Triton is re-derived from the library's function."""
    from warmd.rederive import how_rederived

    rogue = rogue_entry(tmp_path / "a" / "triton", "rogue_kernel")
    (result,), counts = produce(server, tmp_path)
    assert (result.name, result.outcome) == (rogue.name, "refused"), result
    assert "no @triton.jit function named rogue_kernel" in result.why
    assert "stays local" in result.why
    assert counts == [("rederive_refused", "triton", 1)]
    assert not list(server.client().scan_iter(match="warmd:v1:man:*"))
    assert "kernel function" in how_rederived("triton")


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
        assert a.counts["captured"] == {"triton": 1}  # submitted once, too
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

    from warmd.capture.scope import adapters_for

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
    assert all(Manifest.decode(m, 1 << 30).producer == "node-b" for m in signed)


def test_the_plan_and_status_say_how_each_librarys_captures_are_re_derived():
    """`warmd plan` names, per library of its tasks, what a trusted producer regenerates a
    captured kernel from; a library with no re-derivation says its captures stay local."""
    from click.testing import CliRunner

    from warmd.cli import main
    from warmd.rederive import NOT_REDERIVED, how_rederived

    result = CliRunner().invoke(main, ["plan", "--json", "--model", "deepseek-v3", "--tp",
                                       "8", "--target", "h200", "--with", "deep_gemm",
                                       "--without", "flashinfer"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["rederivation"]) == {"deep_gemm", "triton", "flashinfer_autotune"}
    assert "template arguments" in data["rederivation"]["deep_gemm"]
    # Triton plans no task, but engines compile its kernels at run time
    assert "library's kernel function" in data["rederivation"]["triton"]
    text = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3", "--tp", "8",
                                     "--target", "h200"]).output
    assert "triton: from the library's kernel function" in " ".join(text.split())
    assert "URI" in how_rederived("flashinfer")
    assert how_rederived("sgl_kernel") == NOT_REDERIVED  # a helper: nothing to re-derive
