"""Both generations' cache entries through one adapter: tests/data/deep_gemm/cache holds
entries sgl-deep-gemm 0.1.4.post1 compiled on an H200, tests/data/deep_gemm/deep_jit entries
laid out as DeepGEMM 2.8.1 writes them (its README says how they were made); and the
fingerprint, which holds the install path only for the generation whose keys do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from warmd.cache.base import UnsafeArtifact
from warmd.libraries import probe_library
from warmd.libraries.deep_gemm import cache as dgc
from warmd.libraries.deep_gemm.cache import (
    COMMITTED,
    DeepGemmCacheAdapter,
    entry_state,
    layout_of,
    parse_kernel_source,
)
from warmd.libraries.deep_gemm.install import Generation

DATA = Path(__file__).parents[1] / "data" / "deep_gemm"
OLD = sorted(p.name for p in (DATA / "cache").iterdir())
NEW = sorted(p.name for p in (DATA / "deep_jit" / "cache").iterdir())
DENSE = next(n for n in NEW if n.startswith("sm90_fp8_gemm_1d2d."))
TRANSPOSE = next(n for n in NEW if n.startswith("transpose_fp32."))


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A cache root holding entries of both generations (a node that ran both)."""
    root = tmp_path / "dg"
    for source in (DATA / "cache", DATA / "deep_jit" / "cache"):
        shutil.copytree(source, root / "cache", dirs_exist_ok=True)
    (root / "tmp" / "0f3c").mkdir(parents=True)  # DeepGEMM's staging: never an entry
    return root


def test_deep_jit_data_has_the_layout_deep_gemm_2_8_writes():
    for name in NEW:
        path = DATA / "deep_jit" / "cache" / name
        assert sorted(p.name for p in path.iterdir()) == [COMMITTED, "kernel.cu",
                                                          "kernel.cubin", "meta.json"]
        assert (path / COMMITTED).stat().st_size == 0
        assert (path / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
        assert "--cubin --output-file" in json.loads((path / "meta.json").read_text())["command"]
        assert layout_of(name).generation is Generation.DEEP_JIT
    assert all(layout_of(n).generation is Generation.NVCC_JIT for n in OLD)
    assert layout_of("kernel.x") is None and layout_of("sm90.nothex") is None


def test_parse_deep_jit_kernel_sources():
    dense = parse_kernel_source((DATA / "deep_jit" / "cache" / DENSE / "kernel.cu").read_text())
    assert dense.impl == "sm90_fp8_gemm_1d2d_impl" and dense.gemm_type == "Normal"
    assert dense.args[1:4] == ("0", "2304", "4096")
    helper = parse_kernel_source(
        (DATA / "deep_jit" / "cache" / TRANSPOSE / "kernel.cu").read_text())
    assert helper.impl == "transpose_fp32" and helper.gemm_type is None


def test_lists_complete_entries_of_both_generations(mixed: Path):
    adapter = DeepGemmCacheAdapter(mixed)
    assert [e.name for e in adapter.list_entries()] == sorted(OLD + NEW)
    assert adapter.find(DENSE).path == mixed / "cache" / DENSE


@pytest.mark.parametrize("missing", [COMMITTED, "kernel.cubin", "kernel.cu"])
def test_a_deep_jit_entry_without_its_marker_or_files_is_not_an_entry(mixed: Path,
                                                                      missing: str):
    """Without .committed DeepJIT compiles the kernel again over the directory: warmd
    neither lists, packs nor counts it."""
    (mixed / "cache" / DENSE / missing).unlink()
    adapter = DeepGemmCacheAdapter(mixed)
    assert entry_state(mixed / "cache" / DENSE) == "incomplete"
    assert adapter.find(DENSE) is None and DENSE not in {e.name for e in adapter.list_entries()}
    with pytest.raises(dgc.IncompleteEntry, match=r"\.committed"):
        adapter.pack(dgc.CacheEntry("deep_gemm", DENSE, mixed / "cache" / DENSE))


def test_deep_jit_entries_install_whole_elsewhere(mixed: Path, tmp_path: Path):
    source = DeepGemmCacheAdapter(mixed)
    fresh = DeepGemmCacheAdapter(tmp_path / "other")
    for name in (DENSE, TRANSPOSE, OLD[0]):
        installed = fresh.install(name, source.pack(source.find(name)))
        original = mixed / "cache" / name
        assert sorted(p.name for p in installed.path.iterdir()) == sorted(
            p.name for p in original.iterdir())
        for file in original.iterdir():
            assert (installed.path / file.name).read_bytes() == file.read_bytes()
    assert [e.name for e in fresh.list_entries()] == sorted([DENSE, TRANSPOSE, OLD[0]])


def _artifact(tmp_path: Path, name: str, files: dict[str, bytes]) -> bytes:
    staged = tmp_path / "make" / name
    staged.mkdir(parents=True)
    for rel, data in files.items():
        (staged / rel).write_bytes(data)
    return dgc.pack_directory(staged)


@pytest.mark.parametrize("case", ["no marker", "stray file", "old layout's name"])
def test_install_refuses_what_deep_jit_would_not_take(mixed: Path, tmp_path: Path, case):
    entry = mixed / "cache" / DENSE
    files = {p.name: p.read_bytes() for p in entry.iterdir()}
    name = DENSE
    if case == "no marker":
        del files[COMMITTED]
    elif case == "stray file":
        files["run.sh"] = b"#!/bin/sh\n"
    else:
        name = f"kernel.{DENSE}"  # kernel.<tag>.<hex>: 0.1.x's name, 2.8's files
    target = DeepGemmCacheAdapter(tmp_path / "target")
    with pytest.raises(UnsafeArtifact):
        target.install(name, _artifact(tmp_path, name, files))
    assert target.list_entries() == [] and not (target.entries_dir / name).exists()


# ----- fingerprint -----

def _package(base: Path, version: str | None, header: bytes) -> Path:
    """An installed deep_gemm (package, VERSION unless version is None, headers); nothing
    is imported from it."""
    package = base / "deep_gemm"
    (package / "include" / "deep_gemm").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    if version is not None:
        (package / "VERSION").write_text(version)
    (package / "include" / "deep_gemm" / "gemm.cuh").write_bytes(header)
    return package


def _fingerprint(monkeypatch: pytest.MonkeyPatch, site: Path) -> dict:
    with monkeypatch.context() as mp:
        mp.syspath_prepend(str(site))
        probe_library.cache_clear()
        try:
            return DeepGemmCacheAdapter(site / "cache", arch="9.0a", sms=132).fingerprint_inputs()
        finally:
            probe_library.cache_clear()


def test_fingerprint_names_install_path_headers_toolkit_and_env(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    dgc._include_digest.cache_clear()
    a = _package(tmp_path / "siteA", None, b"// v1\n")
    b = _package(tmp_path / "siteB", None, b"// v1\n")
    c = _package(tmp_path / "siteC", None, b"// v2\n")
    fa = _fingerprint(monkeypatch, tmp_path / "siteA")
    fb = _fingerprint(monkeypatch, tmp_path / "siteB")
    fc = _fingerprint(monkeypatch, tmp_path / "siteC")
    assert fa["install_path"] == str(a.resolve()) and fb["install_path"] == str(b.resolve())
    assert fa != fb  # same headers, another install path: kernels would all miss
    assert fa["include_digest"] == fb["include_digest"] != fc["include_digest"]
    assert str(c.resolve()) == fc["install_path"]
    assert fa["arch"] == "9.0a" and fa["sms"] == 132 and "cuda" in fa and "version" in fa
    monkeypatch.setenv("DG_JIT_USE_NVRTC", "1")
    assert _fingerprint(monkeypatch, tmp_path / "siteA")["env"] == {"DG_JIT_USE_NVRTC": "1"}


def test_deep_jit_fingerprint_leaves_the_install_path_out(tmp_path, monkeypatch):
    """2.8's key hashes the headers' contents, not where they are (measured on the H200):
    the same version at two paths shares entries; another version or other headers never."""
    dgc._include_digest.cache_clear()
    _package(tmp_path / "a", "2.8.1", b"// v1\n")
    _package(tmp_path / "b", "2.8.1", b"// v1\n")
    _package(tmp_path / "c", "2.8.1", b"// v2\n")
    _package(tmp_path / "d", "2.8.2", b"// v1\n")
    fa, fb, fc, fd = (_fingerprint(monkeypatch, tmp_path / s) for s in "abcd")
    assert fa["generation"] == "deep_jit" and fa["install_path"] is None
    assert fa == fb
    assert fa != fc and fa["include_digest"] != fc["include_digest"]
    assert fa != fd and fd["version"] == "2.8.2"


def test_nvcc_jit_fingerprint_keeps_the_install_path(tmp_path, monkeypatch):
    dgc._include_digest.cache_clear()
    a = _package(tmp_path / "a", "0.1.4.post1", b"// v1\n")
    _package(tmp_path / "b", "0.1.4.post1", b"// v1\n")
    fa, fb = (_fingerprint(monkeypatch, tmp_path / s) for s in "ab")
    assert fa["generation"] == "nvcc_jit" and fa["install_path"] == str(a.resolve())
    assert fa != fb  # another install path: every 0.1.x key differs
    unknown = _fingerprint(monkeypatch, _package(tmp_path / "u", "9.9.9", b"").parent)
    assert unknown["generation"] is None and unknown["install_path"]  # never a wrong hit
