"""DeepGEMM's cache adapter and executor on a machine without a GPU.

tests/data/deep_gemm/cache holds real entries that sgl-deep-gemm 0.1.4.post1 compiled on an
H200 (scripts/bench/device_deepgemm.sh): two dense fp8_gemm_nt kernels (shape-agnostic: SHAPE_N
and SHAPE_K are 0 in their kernel.cu), one grouped contiguous kernel of Qwen3-30B-A3B
(N=2048, K=768, 128 experts) and one transpose_fp32 layout kernel.
"""

from __future__ import annotations

import ctypes
import io
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import hardware
import pytest

from warmd.cache.base import UnsafeArtifact
from warmd.cache.install import STAGING_DIR
from warmd.cache.packing import pack_directory
from warmd.libraries.deep_gemm import accounting
from warmd.libraries.deep_gemm import cache as dgc
from warmd.libraries.deep_gemm.accounting import Accounting, StdoutCapture
from warmd.libraries.deep_gemm.cache import (
    DeepGemmCacheAdapter,
    IncompleteEntry,
    entry_state,
    parse_kernel_source,
)
from warmd.libraries.deep_gemm.executor import DeepGemmExecutor
from warmd.libraries.deep_gemm.gemms import gemm_spec
from warmd.libraries.deep_gemm.install import Generation
from warmd.tasks import Task

DATA = Path(__file__).parents[1] / "data" / "deep_gemm" / "cache"
NAMES = sorted(p.name for p in DATA.iterdir())
DENSE = [n for n in NAMES if n.startswith("kernel.sm90_fp8_gemm_1d2d.")]
GROUPED = next(n for n in NAMES if n.startswith("kernel.sm90_m_grouped_fp8_gemm_contiguous"))
TRANSPOSE = next(n for n in NAMES if n.startswith("kernel.transpose_fp32."))
ROOT_DIR = Path(__file__).resolve().parents[2]


def _root_with_data(root: Path) -> Path:
    shutil.copytree(DATA, root / "cache")
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _root_with_data(tmp_path / "dg")


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _visible(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "cache").iterdir() if not p.name.startswith("."))


def _staging(root: Path) -> list[str]:
    staging = root / "cache" / STAGING_DIR
    return sorted(os.listdir(staging)) if staging.exists() else []


# ----- the data itself, as DeepGEMM wrote it -----

def test_test_data_is_real_deep_gemm_output():
    assert len(DENSE) == 2 and GROUPED and TRANSPOSE
    for name in NAMES:
        files = sorted(os.listdir(DATA / name))
        assert files == ["kernel.cu", "kernel.cubin"], name  # no completion marker exists
        assert (DATA / name / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
        assert dgc.layout_of(name).generation is Generation.NVCC_JIT
    assert sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file()) < 1_000_000


def test_parse_real_kernel_sources():
    grouped = parse_kernel_source((DATA / GROUPED / "kernel.cu").read_text())
    assert grouped.impl == "sm90_fp8_gemm_1d2d_impl"
    assert grouped.gemm_type == "MGroupedContiguous"
    assert grouped.args[1:5] == ("0", "2048", "768", "128")  # M, N, K, groups
    assert "132" in grouped.args  # the SM count is compiled in: part of the key
    for name in DENSE:
        dense = parse_kernel_source((DATA / name / "kernel.cu").read_text())
        assert dense.gemm_type == "Normal"
        assert dense.args[1:4] == ("0", "0", "0")  # compiled_dims='': shared by all shapes
    transpose = parse_kernel_source((DATA / TRANSPOSE / "kernel.cu").read_text())
    assert transpose.impl == "transpose_fp32" and transpose.gemm_type is None
    assert parse_kernel_source("int main() { return 0; }") is None


# ----- listing -----

def test_lists_complete_entries_and_nothing_else(root: Path):
    (root / "tmp" / "0123abcd").mkdir(parents=True)  # DeepGEMM's own build staging
    (root / "tmp" / "0123abcd" / "kernel.cu").write_text("// being built")
    (root / "cache" / STAGING_DIR / "host+1+abc").mkdir(parents=True)
    (root / "cache" / "kernel.not_a_digest").mkdir()
    (root / "cache" / "README").write_text("not an entry")
    adapter = DeepGemmCacheAdapter(root)
    entries = adapter.list_entries()
    assert [e.name for e in entries] == NAMES
    assert all(e.library == "deep_gemm" and e.path == root / "cache" / e.name for e in entries)


@pytest.mark.parametrize("missing", ["kernel.cubin", "kernel.cu"])
def test_entry_missing_a_file_is_neither_listed_nor_packed(root: Path, missing: str):
    broken = root / "cache" / (GROUPED[:-32] + "0" * 32)
    shutil.copytree(root / "cache" / GROUPED, broken)
    (broken / missing).unlink()
    adapter = DeepGemmCacheAdapter(root)
    assert entry_state(broken) == "incomplete"
    assert broken.name not in [e.name for e in adapter.list_entries()]
    with pytest.raises(IncompleteEntry, match="incomplete"):
        adapter.pack(dgc.CacheEntry("deep_gemm", broken.name, broken))


def test_install_never_hides_a_damaged_entry(root: Path):
    damaged = root / "cache" / GROUPED
    (damaged / "kernel.cubin").unlink()
    adapter = DeepGemmCacheAdapter(root)
    artifact = _artifact_from(root.parent, {
        "kernel.cu": (DATA / GROUPED / "kernel.cu").read_bytes(),
        "kernel.cubin": (DATA / GROUPED / "kernel.cubin").read_bytes()})
    with pytest.raises(IncompleteEntry, match="remove it"):
        adapter.install(GROUPED, artifact)
    assert sorted(os.listdir(damaged)) == ["kernel.cu"]  # left as it was, for a person


def test_entry_whose_cubin_is_a_symlink_is_not_complete(root: Path):
    linked = root / "cache" / (DENSE[0][:-32] + "1" * 32)
    linked.mkdir()
    shutil.copy(root / "cache" / DENSE[0] / "kernel.cu", linked / "kernel.cu")
    (linked / "kernel.cubin").symlink_to(root / "cache" / DENSE[0] / "kernel.cubin")
    assert entry_state(linked) == "incomplete"
    assert linked.name not in [e.name for e in DeepGemmCacheAdapter(root).list_entries()]


# ----- pack and install -----

def test_pack_is_deterministic(root: Path):
    adapter = DeepGemmCacheAdapter(root)
    entry = adapter.find(GROUPED)
    first = adapter.pack(entry)
    os.utime(entry.path / "kernel.cubin", (1, 1))
    assert adapter.pack(entry) == first
    assert adapter.pack(adapter.find(DENSE[0])) != first


def test_install_roundtrip_into_a_fresh_root(root: Path, tmp_path: Path):
    source = DeepGemmCacheAdapter(root)
    fresh = DeepGemmCacheAdapter(tmp_path / "fresh")
    for entry in source.list_entries():
        installed = fresh.install(entry.name, source.pack(entry))
        assert installed.path == tmp_path / "fresh" / "cache" / entry.name
        for name in ("kernel.cu", "kernel.cubin"):
            assert (installed.path / name).read_bytes() == (entry.path / name).read_bytes()
    assert [e.name for e in fresh.list_entries()] == NAMES
    assert _visible(tmp_path / "fresh") == NAMES and _staging(tmp_path / "fresh") == []
    # Installing again keeps what is there (same inode), whatever the artifact says.
    inode = (tmp_path / "fresh" / "cache" / GROUPED / "kernel.cubin").stat().st_ino
    fresh.install(GROUPED, source.pack(source.find(DENSE[0])))
    assert (tmp_path / "fresh" / "cache" / GROUPED / "kernel.cubin").stat().st_ino == inode


@pytest.mark.parametrize("name", ["../evil", "kernel.x", "x", STAGING_DIR, "kernel.sm90.XYZ",
                                  f"{GROUPED}/kernel.cu", ""])
def test_install_refuses_names_that_are_not_entries(root: Path, tmp_path: Path, name: str):
    artifact = DeepGemmCacheAdapter(root).pack(DeepGemmCacheAdapter(root).find(GROUPED))
    with pytest.raises(UnsafeArtifact):
        DeepGemmCacheAdapter(tmp_path / "fresh").install(name, artifact)
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "fresh" / "cache").exists() or _visible(tmp_path / "fresh") == []


def _artifact_from(tmp_path: Path, files: dict[str, bytes]) -> bytes:
    staged = tmp_path / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    for rel, data in files.items():
        (staged / rel).parent.mkdir(parents=True, exist_ok=True)
        (staged / rel).write_bytes(data)
    return pack_directory(staged)


@pytest.mark.parametrize("case", ["only_source", "empty_cubin", "extra_file", "subdir"])
def test_install_refuses_artifacts_deep_gemm_would_reject(root: Path, tmp_path: Path,
                                                          case: str):
    cu = (root / "cache" / GROUPED / "kernel.cu").read_bytes()
    cubin = (root / "cache" / GROUPED / "kernel.cubin").read_bytes()
    files = {
        "only_source": {"kernel.cu": cu},
        "empty_cubin": {"kernel.cu": cu, "kernel.cubin": b""},
        "extra_file": {"kernel.cu": cu, "kernel.cubin": cubin, "run.sh": b"#!/bin/sh\n"},
        "subdir": {"kernel.cu": cu, "kernel.cubin": cubin, "more/kernel.cubin": cubin},
    }[case]
    fresh = tmp_path / "fresh"
    with pytest.raises(UnsafeArtifact):
        DeepGemmCacheAdapter(fresh).install(GROUPED, _artifact_from(tmp_path, files))
    assert _visible(fresh) == [] and _staging(fresh) == []


@pytest.mark.parametrize("case", ["symlink", "traversal", "absolute"])
def test_install_refuses_unsafe_archives(root: Path, tmp_path: Path, case: str):
    cu = (root / "cache" / GROUPED / "kernel.cu").read_bytes()
    link = tarfile.TarInfo("kernel.cubin")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    members = {"symlink": [_file("kernel.cu", cu), (link, None)],
               "traversal": [_file("kernel.cu", cu), _file("../../evil", b"x")],
               "absolute": [_file("kernel.cu", cu), _file(str(tmp_path / "evil"), b"x")]}[case]
    fresh = tmp_path / "fresh"
    with pytest.raises(UnsafeArtifact):
        DeepGemmCacheAdapter(fresh).install(GROUPED, _tar(members))
    assert not (tmp_path / "evil").exists() and not (fresh / "evil").exists()
    assert _visible(fresh) == [] and _staging(fresh) == []


_PAUSED_INSTALL = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from warmd.libraries.deep_gemm import cache as dgc

    real_check = dgc._check_staged

    def paused(staged):
        real_check(staged)
        Path(sys.argv[3]).write_text("staged")  # unpacked and checked, not yet renamed
        time.sleep(60)

    dgc._check_staged = paused
    adapter = dgc.DeepGemmCacheAdapter(Path(sys.argv[1]))
    adapter.install(sys.argv[2], Path(sys.argv[4]).read_bytes())
""")


def test_installer_killed_mid_install_leaves_no_entry(root: Path, tmp_path: Path):
    artifact_file = tmp_path / "artifact.tgz"
    source = DeepGemmCacheAdapter(root)
    artifact_file.write_bytes(source.pack(source.find(GROUPED)))
    fresh, ready = tmp_path / "fresh", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", _PAUSED_INSTALL, str(fresh), GROUPED,
                              str(ready), str(artifact_file)], cwd=ROOT_DIR)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, "installer exited early"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    adapter = DeepGemmCacheAdapter(fresh)
    assert not (fresh / "cache" / GROUPED).exists() and adapter.list_entries() == []
    assert len(_staging(fresh)) == 1  # the dead installer's work, invisible to DeepGEMM
    installed = adapter.install(GROUPED, artifact_file.read_bytes())
    assert entry_state(installed.path) == "complete"
    assert _staging(fresh) == []  # the stale staging dir of the dead pid was cleaned


def _install_from_process(args: tuple[str, str, str, float]) -> str:
    root, name, artifact_path, start_at = args
    time.sleep(max(0.0, start_at - time.time()))
    entry = DeepGemmCacheAdapter(Path(root)).install(name, Path(artifact_path).read_bytes())
    return str(entry.path)


def test_concurrent_installers_make_one_complete_entry(root: Path, tmp_path: Path):
    source = DeepGemmCacheAdapter(root)
    artifact_file = tmp_path / "artifact.tgz"
    artifact_file.write_bytes(source.pack(source.find(DENSE[0])))
    fresh = tmp_path / "fresh"
    start_at = time.time() + 2.0
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        paths = pool.map(_install_from_process,
                         [(str(fresh), DENSE[0], str(artifact_file), start_at)] * 6)
    assert set(paths) == {str(fresh / "cache" / DENSE[0])}
    assert _visible(fresh) == [DENSE[0]] and _staging(fresh) == []
    assert sorted(os.listdir(fresh / "cache" / DENSE[0])) == ["kernel.cu", "kernel.cubin"]
    assert ((fresh / "cache" / DENSE[0] / "kernel.cubin").read_bytes()
            == (root / "cache" / DENSE[0] / "kernel.cubin").read_bytes())


# ----- DG_JIT_CACHE_DIR is one path -----

def test_colon_in_cache_dir_is_one_directory_like_deep_gemm(root: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """sgl-deep-gemm 0.1.4.post1 compiled into a directory literally named 'A:B' and read
    nothing from B (H200, docs/benchmarks.md): warmd must look exactly there too."""
    literal = Path(f"{tmp_path / 'front'}:{root}")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(literal))
    adapter = DeepGemmCacheAdapter()
    assert adapter.root == literal and adapter.list_entries() == []
    assert adapter.find(GROUPED) is None  # B's entries are not DeepGEMM's here
    source = DeepGemmCacheAdapter(root)
    installed = adapter.install(GROUPED, source.pack(source.find(GROUPED)))
    assert installed.path == literal / "cache" / GROUPED
    assert [e.name for e in adapter.list_entries()] == [GROUPED]


# ----- executor -----

def _task(kernel="fp8_gemm_nt", n=2048, k=4096, groups=None, m=(1, 64, 64, 8)) -> Task:
    return Task("deep_gemm", kernel, n, k, groups, m, key=f"deep_gemm/{kernel}/{n}x{k}/test")


def test_gemm_spec_validates_tasks():
    spec = gemm_spec(_task())
    assert spec.m == (1, 8, 64) and spec.gemm_type == "Normal" and spec.num_groups is None
    grouped = gemm_spec(_task("m_grouped_fp8_gemm_nt_contiguous", 2048, 768, 128, (256, 128)))
    assert grouped.gemm_type == "MGroupedContiguous" and grouped.num_groups == 128
    for bad, match in [(_task("bf16_gemm_nt"), "cannot run kernel"),
                       (_task("m_grouped_fp8_gemm_nt_contiguous", 2112, 7168, 8), "multiple"),
                       (_task("m_grouped_fp8_gemm_nt_contiguous", groups=None), "num_groups"),
                       (_task(m=()), "M values"), (_task(n=0), "N/K")]:
        with pytest.raises(ValueError, match=match):
            gemm_spec(bad)


@pytest.mark.skipif(hardware.deep_gemm_runs(), reason="DeepGEMM can run on this machine")
def test_executor_check_says_why_it_cannot_run_here(tmp_path: Path):
    executor = DeepGemmExecutor(tmp_path / "dg")
    ok, reason = executor.check()
    assert not ok
    if not hardware.deep_gemm_installed():
        assert "DeepGEMM not installed" in reason or "import deep_gemm failed" in reason
    if not hardware.has_gpu():
        assert "no CUDA GPU" in reason or "torch not installed" in reason
    result = executor.run(_task())
    assert not result.ok and result.error == reason
    assert [k.outcome for k in result.kernels] == ["failed"]
    assert not (tmp_path / "dg").exists()


def test_stdout_capture_sees_what_c_code_prints(capfd: pytest.CaptureFixture):
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile() as buffer:
        capture = StdoutCapture(buffer)
        capture.start()
        libc.printf(b"Load time (/x/cache/kernel.a.0123456789abcdef): 1.25 ms\n")
        os.write(1, b"from fd 1\n")
        printed = capture.stop()
    assert printed == ("Load time (/x/cache/kernel.a.0123456789abcdef): 1.25 ms\n"
                       "from fd 1\n")
    assert "Load time" not in capfd.readouterr().out


def test_accounting_classifies_loads_against_entries_before_the_call(
        tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "dg"
    (root / "cache").mkdir(parents=True)
    shutil.copytree(DATA / DENSE[0], root / "cache" / DENSE[0])
    adapter = DeepGemmCacheAdapter(root)
    books = Accounting(adapter, gemm_spec(_task()))
    books.start()
    # DeepGEMM renames a finished build into cache/ and then loads it.
    shutil.copytree(DATA / DENSE[1], root / "cache" / DENSE[1])
    printed = (f"Load time ({root}/cache/{DENSE[0]}): 0.80 ms\n"
               f"Load time ({root}/cache/{DENSE[1]}): 1.10 ms\n"
               "Warning: something DeepGEMM said\n")
    monkeypatch.setattr(accounting, "_loads_seen", False)
    books.after_call(printed, 4.2)
    outcomes = {k.name: (k.outcome, k.seconds) for k in books.result()}
    assert outcomes == {DENSE[0]: ("local_hit", 0.0), DENSE[1]: ("compiled", 4.2)}
    assert capfd.readouterr().out == "Warning: something DeepGEMM said\n"


def test_accounting_falls_back_to_cache_scan_when_nothing_is_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "dg"
    (root / "cache").mkdir(parents=True)
    adapter = DeepGemmCacheAdapter(root)
    monkeypatch.setattr(accounting, "_loads_seen", False)
    books = Accounting(adapter, gemm_spec(_task()))
    books.start()
    for name in (DENSE[0], GROUPED, TRANSPOSE):
        shutil.copytree(DATA / name, root / "cache" / name)
    half = root / "cache" / (DENSE[1][:-32] + "2" * 32)
    half.mkdir()  # another process is still writing this one (layouts that build in place)
    books.after_call("", 3.0)
    # The grouped kernel is another GEMM type: a concurrent worker's, not this dense task's.
    assert sorted(k.name for k in books.result()) == sorted([DENSE[0], TRANSPOSE])
    shutil.copytree(DATA / DENSE[1], half, dirs_exist_ok=True)
    books.after_call("", 2.0)
    assert half.name in [k.name for k in books.result()]


@pytest.mark.slow
def test_warmup_fails_deep_gemm_tasks_without_stopping_others(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    """Where DeepGEMM cannot run (a CPU machine) every DeepGEMM task fails with the
    executor's reason while the FlashInfer task of the same plan still builds (silu_and_mul,
    sm_90a); where it can (a GPU node with DeepGEMM), its tasks compile as well."""
    from warmd.plan import PlanRequest, make_plan
    from warmd.warmup import WarmupOptions, run_warmup

    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    plan = make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200", engine="sglang",
                                 with_libs=("flashinfer", "deep_gemm"),
                                 without_libs=("sgl_kernel",)))
    options = WarmupOptions(task_filter="act_and_mul|deep_gemm/", workers=2,
                            cache_roots={"flashinfer": tmp_path / "fi",
                                         "deep_gemm": tmp_path / "dg"})
    report = run_warmup(plan, options)
    by_library: dict[str, list] = {}
    for task_report in report.reports:
        by_library.setdefault(task_report.task.library, []).append(task_report.result)
    assert len(by_library["deep_gemm"]) >= 2
    (flashinfer,) = by_library["flashinfer"]
    assert flashinfer.ok and [k.outcome for k in flashinfer.kernels] == ["compiled"]
    if hardware.deep_gemm_runs():
        assert all(result.ok for result in by_library["deep_gemm"]), report.to_json()
        compiled = sum(k.outcome == "compiled" for r in by_library["deep_gemm"]
                       for k in r.kernels)
        assert compiled > 0 and report.counters.compiled == 1 + compiled
        assert report.counters.failed == 0
        return
    for result in by_library["deep_gemm"]:
        assert not result.ok and "deep_gemm cannot run here" in result.error
        if not hardware.has_gpu():
            assert "no CUDA GPU" in result.error or "torch not installed" in result.error
    assert report.counters.failed == len(by_library["deep_gemm"])
    assert report.counters.compiled == 1
    assert not (tmp_path / "dg" / "cache").exists()
