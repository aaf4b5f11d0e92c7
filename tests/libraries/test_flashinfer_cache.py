"""FlashInfer's cache adapter against real sm_90a builds on this CPU (nvcc, ninja, no GPU).

The module built here is silu_and_mul (a few seconds); the plan is SGLang's for
qwen3-30b-a3b-fp8 on an H200 without sgl_kernel, whose activation goes to FlashInfer.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from flashinfer_support import act_and_mul_built, warm_act_and_mul

from warmd.cache.base import IncompatibleHere, UnsafeArtifact
from warmd.cache.install import unpack_safely
from warmd.cache.packing import pack_directory
from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
from warmd.libraries.flashinfer.ninja import (
    ninja_commands,
    rapidhash,
    read_deps_log,
    read_ninja_log,
    write_deps_log,
    write_ninja_log,
)

pytestmark = pytest.mark.slow
MODULE = "silu_and_mul"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("flashinfer")
    with act_and_mul_built(base, base / "wsA") as (plan, report):
        yield SimpleNamespace(base=base, plan=plan, report=report,
                              adapter=FlashInferCacheAdapter(base / "wsA", "9.0a"))


def _log(adapter: FlashInferCacheAdapter):
    return read_ninja_log(adapter.root / MODULE / ".ninja_log")[1]


def test_cold_build_is_counted_compiled(built):
    report = built.report
    assert report.counters.compiled == 1 and report.counters.failed == 0
    (task,) = report.reports
    assert task.result.ok and task.task.module == MODULE
    (kernel,) = task.result.kernels
    assert kernel.outcome == "compiled" and kernel.seconds > 0.5
    assert [e.name for e in built.adapter.list_entries()] == [MODULE]
    assert (built.adapter.root / MODULE / f"{MODULE}.so").stat().st_size > 10_000
    assert (built.adapter.generated_dir / f"{MODULE}.cu").exists()


def test_rapidhash_matches_what_ninja_recorded(built):
    module = built.adapter.root / MODULE
    commands = ninja_commands(module)
    version, entries = read_ninja_log(module / ".ninja_log")
    assert version == 7 and len(entries) == 2
    for output, entry in entries.items():
        assert format(rapidhash(commands[output].encode()), "x") == entry.command_hash


def test_deps_log_roundtrips_byte_for_byte(built, tmp_path):
    deps_path = built.adapter.root / MODULE / ".ninja_deps"
    deps = read_deps_log(deps_path)
    assert len(deps.paths) > 100 and deps.records
    write_deps_log(tmp_path / "copy", deps)
    assert (tmp_path / "copy").read_bytes() == deps_path.read_bytes()


def test_second_run_is_a_local_hit_with_no_ninja_work(built):
    before = _log(built.adapter)
    report = warm_act_and_mul(built.plan, built.base / "wsA")
    c = report.counters
    assert (c.local_hits, c.compiled, c.failed) == (1, 0, 0)
    assert c.compile_seconds_saved == 0.0  # this node's own compile: no time saved
    assert _log(built.adapter) == before


def test_pack_is_deterministic(built):
    entry = built.adapter.entry(MODULE)
    assert built.adapter.pack(entry) == built.adapter.pack(entry)


def test_pack_delete_install_gives_zero_builds(built):
    adapter = built.adapter
    artifact = adapter.pack(adapter.entry(MODULE))
    shutil.rmtree(adapter.root / MODULE)
    assert adapter.list_entries() == []
    adapter.install(MODULE, artifact)
    assert adapter.is_up_to_date(MODULE)[0]
    installed = _log(adapter)
    report = warm_act_and_mul(built.plan, built.base / "wsA")
    assert (report.counters.local_hits, report.counters.compiled) == (1, 0)
    assert _log(adapter) == installed  # ninja ran no command


def _copy_module_verbatim(src: FlashInferCacheAdapter, dst: FlashInferCacheAdapter) -> None:
    shutil.copytree(src.root / MODULE, dst.root / MODULE)
    shutil.copytree(src.generated_dir, dst.generated_dir)


def test_install_under_another_workspace_path_gives_zero_builds(built):
    artifact = built.adapter.pack(built.adapter.entry(MODULE))
    # control: the same files copied verbatim under another workspace all rebuild
    copied = FlashInferCacheAdapter(built.base / "copied", "9.0a")
    _copy_module_verbatim(built.adapter, copied)
    control = warm_act_and_mul(built.plan, built.base / "copied")
    assert (control.counters.local_hits, control.counters.compiled) == (0, 1)

    other_base = built.base / "another" / "node" / "workspace"
    other = FlashInferCacheAdapter(other_base, "9.0a")
    entry = other.install(MODULE, artifact)
    assert entry.path == other.root / MODULE
    build_ninja = (entry.path / "build.ninja").read_text()
    assert str(built.base / "wsA") not in build_ninja and str(other_base) in build_ninja
    assert other.is_up_to_date(MODULE)[0]
    installed = _log(other)
    # FlashInfer's own JitSpec.build() in a worker
    report = warm_act_and_mul(built.plan, other_base)
    assert (report.counters.local_hits, report.counters.compiled) == (1, 0)
    assert _log(other) == installed
    so = f"{MODULE}.so"
    assert (entry.path / so).read_bytes() == (built.adapter.root / MODULE / so).read_bytes()


def test_install_refuses_a_module_that_would_rebuild(built, tmp_path):
    artifact = built.adapter.pack(built.adapter.entry(MODULE))
    # this node's generator writes another source than the one the module was built from
    clash = FlashInferCacheAdapter(tmp_path / "clash", "9.0a")
    clash.generated_dir.mkdir(parents=True)
    (clash.generated_dir / f"{MODULE}.cu").write_text("// another flashinfer version\n")
    with pytest.raises(IncompatibleHere, match="differs"):
        clash.install(MODULE, artifact)
    assert clash.list_entries() == [] and not (clash.root / MODULE).exists()

    # built against a header this node does not have (another toolchain)
    unpacked = tmp_path / "unpacked"
    unpack_safely(artifact, unpacked)
    deps = read_deps_log(unpacked / "module" / ".ninja_deps")
    deps.paths = [p.replace("/usr/include/", "/opt/elsewhere/include/") for p in deps.paths]
    write_deps_log(unpacked / "module" / ".ninja_deps", deps)
    foreign = FlashInferCacheAdapter(tmp_path / "foreign", "9.0a")
    with pytest.raises(IncompatibleHere, match="missing here"):
        foreign.install(MODULE, pack_directory(unpacked))
    assert not (foreign.root / MODULE).exists()


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(directory).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_refused_install_leaves_generated_unchanged(built, tmp_path):
    artifact = built.adapter.pack(built.adapter.entry(MODULE))
    unpacked = tmp_path / "unpacked"
    unpack_safely(artifact, unpacked)
    shipped = sorted(p.relative_to(unpacked / "generated").as_posix()
                     for p in (unpacked / "generated").rglob("*") if p.is_file())
    assert f"{MODULE}.cu" in shipped
    deps = read_deps_log(unpacked / "module" / ".ninja_deps")
    deps.paths = [p.replace("/usr/include/", "/opt/elsewhere/include/") for p in deps.paths]
    write_deps_log(unpacked / "module" / ".ninja_deps", deps)
    foreign = pack_directory(unpacked)

    # a node with no generated sources yet: the refusal must not create any
    empty = FlashInferCacheAdapter(tmp_path / "empty", "9.0a")
    with pytest.raises(IncompatibleHere, match="missing here"):
        empty.install(MODULE, foreign)
    assert _snapshot(empty.generated_dir) == {} and not (empty.root / MODULE).exists()

    # a node with some other module's sources: left exactly as they were (bytes and mtimes)
    busy = FlashInferCacheAdapter(tmp_path / "busy", "9.0a")
    busy.generated_dir.mkdir(parents=True)
    (busy.generated_dir / "gelu_and_mul.cu").write_text("// another module\n")
    before = _snapshot(busy.generated_dir)
    with pytest.raises(IncompatibleHere, match="missing here"):
        busy.install(MODULE, foreign)
    assert _snapshot(busy.generated_dir) == before

    # control: the untampered artifact installs and brings its generated sources
    busy.install(MODULE, artifact)
    after = _snapshot(busy.generated_dir)
    assert set(after) == set(before) | set(shipped)
    assert busy.is_up_to_date(MODULE)[0]


def test_install_refuses_malformed_artifacts(built, tmp_path):
    artifact = built.adapter.pack(built.adapter.entry(MODULE))
    unpacked = tmp_path / "unpacked"
    unpack_safely(artifact, unpacked)
    (unpacked / "module" / f"{MODULE}.so").unlink()
    target = FlashInferCacheAdapter(tmp_path / "t", "9.0a")
    with pytest.raises(UnsafeArtifact, match="lacks"):
        target.install(MODULE, pack_directory(unpacked))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "evil.sh").write_text("echo")
    with pytest.raises(UnsafeArtifact, match="not a FlashInfer module"):
        target.install(MODULE, pack_directory(tmp_path / "junk"))
    for name in ("../x", "tmp", ".warmd"):
        with pytest.raises(UnsafeArtifact):
            target.install(name, artifact)
    assert not (target.root / MODULE).exists()


def test_module_mid_build_is_not_listed_whoever_holds_the_lock(built, tmp_path):
    """Completeness is what ninja finds on disk, never lock timing: the states a FlashInfer
    build passes through are not complete, and a complete module stays listed while someone
    (an installer re-checking, a pack) holds its lock. (A real build in flight is checked in
    test_warmup_cpu's Ctrl-C test.)"""
    adapter = FlashInferCacheAdapter(tmp_path / "ws", "9.0a")
    adapter.install(MODULE, built.adapter.pack(built.adapter.entry(MODULE)))
    with adapter.module_lock(MODULE):
        assert adapter.is_complete(MODULE)
        assert [e.name for e in adapter.list_entries()] == [MODULE]
    module = adapter.root / MODULE
    log_path = module / ".ninja_log"
    logged = log_path.read_bytes()
    # linking: the objects are logged, the .so is not yet (ninja logs a command once it ran)
    version, entries = read_ninja_log(log_path)
    write_ninja_log(log_path, version, [e for e in entries.values()
                                        if not e.output.endswith(".so")])
    assert not adapter.is_complete(MODULE) and adapter.list_entries() == []
    log_path.write_bytes(logged)
    assert adapter.is_complete(MODULE)
    # rebuilding: the generator rewrote a source, so an object is older than its input
    source = adapter.generated_dir / f"{MODULE}.cu"
    later = source.stat().st_mtime_ns + 10**9
    os.utime(source, ns=(later, later))
    assert not adapter.is_complete(MODULE) and adapter.list_entries() == []
    (module / f"{MODULE}.so").unlink()
    assert not adapter.is_complete(MODULE)


def _install_module(artifact: bytes, base: str) -> bool:
    adapter = FlashInferCacheAdapter(Path(base), "9.0a")
    adapter.install(MODULE, artifact)
    return adapter.is_complete(MODULE)


def test_concurrent_installs_of_one_module(built, tmp_path):
    artifact = built.adapter.pack(built.adapter.entry(MODULE))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_install_module, [(artifact, str(tmp_path / "ws"))] * 3)
    assert results == [True, True, True]
    target = FlashInferCacheAdapter(tmp_path / "ws", "9.0a")
    assert [e.name for e in target.list_entries()] == [MODULE]
    assert sorted(p.name for p in target.root.iterdir()) == [".warmd-staging", MODULE, "tmp"]


def test_fingerprint_inputs_are_portable(built):
    inputs = built.adapter.fingerprint_inputs()
    assert inputs["flashinfer"] == built.adapter.version and inputs["arch"] == "90a"
    for key in ("nvcc", "cxx", "ninja", "tvm_ffi", "python", "cuda_home"):
        assert inputs[key], key
    text = json.dumps(inputs)
    assert str(built.base) not in text  # the workspace path is relocated, not keyed
    # so are the install paths in FlashInfer's commands (origin.json, relocate_module)
    import sysconfig

    import flashinfer

    assert str(Path(flashinfer.__file__).parent) not in text
    assert sysconfig.get_path("include") not in text
    assert FlashInferCacheAdapter(built.base / "x", "9.0a").fingerprint_inputs() == inputs


# ----- a workspace an engine process can write to, read as an attacker's filesystem -----

def _installed_copy(built, base: Path) -> FlashInferCacheAdapter:
    adapter = FlashInferCacheAdapter(base, "9.0a")
    adapter.install(MODULE, built.adapter.pack(built.adapter.entry(MODULE)))
    assert adapter.is_complete(MODULE)
    return adapter


def _append_to_link_line(adapter: FlashInferCacheAdapter, extra: str) -> None:
    build = adapter.root / MODULE / "build.ninja"
    stat_before = build.stat()
    lines = build.read_text().splitlines()
    (i,) = [i for i, line in enumerate(lines) if line.startswith("build ")
            and f"/{MODULE}.so: link " in line]
    lines[i] += f" {extra}"
    build.write_text("\n".join(lines) + "\n")
    os.utime(build, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))


def test_a_symlinked_generated_directory_is_refused_and_its_secret_never_published(
        built, tmp_path, monkeypatch):
    """The issue's exfiltration: a module naming an order-only input under generated/ that
    is a symlink to a directory holding a 0600 file. FlashInfer's own ninja still finds the
    module up to date, so it is complete; packing it must not follow the link."""
    from store_support import start_test_server

    from warmd.capture.scope import CaptureScope
    from warmd.capture.watch import Capture
    from warmd.store import open_shared_cache
    from warmd.targets import preset

    adapter = _installed_copy(built, tmp_path / "ws")
    secret = tmp_path / "outside" / "id_rsa"
    secret.parent.mkdir()
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY----- warmd-test-secret")
    secret.chmod(0o600)
    (adapter.generated_dir / "evil").symlink_to(secret.parent, target_is_directory=True)
    linked = adapter.workspace_dir.resolve() / "generated" / "evil" / "id_rsa"
    _append_to_link_line(adapter, f"|| {linked}")
    assert adapter.is_up_to_date(MODULE)[0]  # ninja: nothing to do, a complete module
    with pytest.raises(UnsafeArtifact, match="symlink"):
        adapter.pack(adapter.entry(MODULE))

    for var in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_AUTOTUNE_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "unused" / var))
    server = start_test_server(tmp_path / "redis")
    try:
        scope = CaptureScope("plan-fi-0123456789abcdef", preset("h200").to_json(),
                             {"flashinfer": str(tmp_path / "ws")})
        cap = Capture("node-a", [scope], lambda target: open_shared_cache(
            server.url, target=target, node="node-a"), inotify=False)
        cap.start()
        cap.stop()
        assert cap.counts["capture_refused"] == {"flashinfer": 1}
        assert cap.total("captured") == 0
        client = server.client()
        assert [k for k in client.scan_iter(match="warmd:v1:blob:*")] == []
        assert not any(b"warmd-test-secret" in (client.get(k) or b"")
                       for k in client.scan_iter(match="warmd:*")
                       if client.type(k) == b"string")
    finally:
        server.stop()


def _forged_include(built, tmp_path: Path, node_file: Path) -> bytes:
    unpacked = tmp_path / "forged"
    unpack_safely(built.adapter.pack(built.adapter.entry(MODULE)), unpacked)
    build = unpacked / "module" / "build.ninja"
    build.write_text(f"include {node_file}\n" + build.read_text())
    return pack_directory(unpacked)


class _Publisher(FlashInferCacheAdapter):
    """A writer of the store publishing a forged module under the real module's name (with
    signing off, any writer can)."""

    def __init__(self, workspace: Path, artifact: bytes) -> None:
        super().__init__(workspace, "9.0a")
        self.artifact = artifact

    def pack(self, entry):
        return self.artifact


def test_a_build_ninja_including_a_node_file_is_quarantined_and_never_echoed(
        built, tmp_path, caplog, capfd):
    """ninja's errors quote the line they stopped at: a stored build.ninja starting with
    `include <a node's file>` printed that file's first line and was never quarantined."""
    from store_support import start_test_server

    from warmd.store import layout, open_shared_cache

    node_file = tmp_path / "passwd"
    node_file.write_text("nodesecret:x:0:0:root:/root:/bin/bash\n")
    forged = _forged_include(built, tmp_path, node_file)
    with pytest.raises(UnsafeArtifact, match="'include' statement") as refused:
        FlashInferCacheAdapter(tmp_path / "unit", "9.0a").install(MODULE, forged)
    assert "nodesecret" not in str(refused.value)

    server = start_test_server(tmp_path / "redis")
    try:
        with open_shared_cache(server.url, node="writer") as writer:
            publisher = _Publisher(tmp_path / "writer", forged)
            writer.entries.publish_task(publisher, "task", [publisher.entry(MODULE)], 1.0)
            fp = writer.fingerprint(publisher).digest
        reader_adapter = FlashInferCacheAdapter(tmp_path / "reader", "9.0a")
        with open_shared_cache(server.url, node="reader") as reader:
            assert reader.entries.fetch_task(reader_adapter, "task") is None
            counts = dict(reader.stats.counters)
        assert counts.get("unsafe_rejected") == 1 and counts.get("quarantined") == 1, counts
        assert "refused_here" not in counts and "install_failed" not in counts
        assert not (reader_adapter.root / MODULE).exists()
        client = server.client()
        assert client.exists(layout.quarantine_key(fp, MODULE))
    finally:
        server.stop()
    out, err = capfd.readouterr()
    assert "nodesecret" not in out + err + caplog.text

    # the same build.ninja planted in a local module: never handed to ninja, never packed
    local = _installed_copy(built, tmp_path / "local")
    build = local.root / MODULE / "build.ninja"
    build.write_text(f"include {node_file}\n" + build.read_text())
    assert local.module_state(MODULE) == "unsafe" and not local.is_complete(MODULE)
    assert [e.name for e in local.list_entries()] == [MODULE]  # listed: capture counts it
    up_to_date, why = local.is_up_to_date(MODULE)
    assert not up_to_date and "nodesecret" not in why
    with pytest.raises(UnsafeArtifact, match="build.ninja"):
        local.pack(local.entry(MODULE))


def test_ninja_is_only_run_on_a_build_ninja_that_opens_nothing_else(built, tmp_path):
    """What FlashInfer writes passes; what would make ninja read another file, or write
    its logs elsewhere, does not (a FIFO there would block ninja for its whole timeout)."""
    from warmd.libraries.flashinfer.ninja import build_ninja_problem

    module = built.adapter.root / MODULE
    real = (module / "build.ninja").read_text()
    where = str(built.adapter.workspace_dir.resolve() / "cached_ops" / MODULE)
    assert build_ninja_problem(real, where) is None
    fifo = tmp_path / "fifo"
    for planted in (f"include {fifo}\n", f"subninja {fifo}\n", f"builddir = {tmp_path}\n",
                    f"include$\n {fifo}\n", f"rule x\n  command = true\n  depfile = {fifo}\n",
                    f"build {tmp_path}/elsewhere.o: compile {fifo}\n",
                    f"build$\n {tmp_path}/x.o: compile y\n"):
        assert build_ninja_problem(planted + real, where) is not None, planted
