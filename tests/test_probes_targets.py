"""Probes with injected environments (fake site dirs, fake toolkits), targets and M values."""

from __future__ import annotations

import re
import sys

import pytest

from warmd.errors import WarmdInputError
from warmd.libraries import probe_libraries, probe_library
from warmd.mvalues import MSpec, aligned_grouped_m, fast_m_values, parse_mspec, relax_m_values
from warmd.targets import Target, arch_with_suffix, parse_capability, resolve_target


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory first on sys.path, for packages that must not be imported."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))

    def add_package(module: str, dist: str, version: str) -> None:
        pkg = root / module
        pkg.mkdir()
        (pkg / "__init__.py").write_text("raise RuntimeError('a probe imported me')\n")
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")

    return add_package


@pytest.fixture
def cuda_home(tmp_path, monkeypatch):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    (home / "include").mkdir()
    (home / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    monkeypatch.setenv("CUDA_HOME", str(home))
    return home


def test_deep_gemm_found_without_import(site, cuda_home):
    site("deep_gemm", "sgl-deep-gemm", "0.1.4.post1")
    probe = probe_library("deep_gemm")
    assert probe.available and probe.can_jit
    assert probe.version == "0.1.4.post1"
    assert "deep_gemm" not in sys.modules


def test_deep_gemm_without_nvcc_cannot_jit(site, tmp_path, monkeypatch):
    site("deep_gemm", "sgl-deep-gemm", "0.1.4.post1")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    probe = probe_library("deep_gemm")
    assert probe.available and not probe.can_jit
    assert "nvcc" in probe.reason


def test_missing_library_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    probe = probe_library("cutlass_dsl")
    assert not probe.available
    assert "nvidia-cutlass-dsl" in probe.reason


def test_nvcc_version_from_toolkit_headers(cuda_home):
    probe = probe_library("nvcc")
    assert probe.available and probe.version == "12.8"


def test_probe_is_cached_once_per_process(site, cuda_home):
    first = probe_library("flashinfer")
    site("flashinfer", "flashinfer-python", "9.9.9")
    assert probe_library("flashinfer") is first


def test_with_and_without_overrides(site, cuda_home):
    site("flashinfer", "flashinfer-python", "0.7.4")
    probes = probe_libraries(with_libs=("deep-gemm",), without_libs=("flashinfer",))
    assert probes["deep_gemm"].available and probes["deep_gemm"].overridden
    assert not probes["flashinfer"].available
    assert "--without" in probes["flashinfer"].reason
    with pytest.raises(WarmdInputError, match="unknown library 'tensorrt'"):
        probe_libraries(with_libs=("tensorrt",))
    with pytest.raises(WarmdInputError, match="both --with and --without"):
        probe_libraries(with_libs=("nvcc",), without_libs=("nvcc",))


@pytest.mark.parametrize("cap, arch", [((9, 0), "9.0a"), ((10, 0), "10.0a"), ((10, 3), "10.3a"),
                                       ((12, 0), "12.0f"), ((8, 9), "8.9"), ((8, 0), "8.0")])
def test_arch_suffix(cap, arch):
    assert arch_with_suffix(cap) == arch


@pytest.mark.parametrize("text, cap", [("9.0", (9, 0)), ("9.0a", (9, 0)), ("sm_90a", (9, 0)),
                                       ("100", (10, 0)), ("12.0f", (12, 0))])
def test_parse_capability(text, cap):
    assert parse_capability(text) == cap


def test_resolve_target_presets_and_flags():
    assert resolve_target("h200").sms == 132
    assert resolve_target("B200").arch == "10.0a"
    custom = resolve_target(capability="9.0", sms=78)
    assert (custom.capability, custom.sms, custom.source) == ((9, 0), 78, "flags")
    assert resolve_target("h100", capability="9.0").sms == 132
    with pytest.raises(WarmdInputError, match="unknown target preset 'h300'.*h100"):
        resolve_target("h300")
    with pytest.raises(WarmdInputError, match="needs --sms"):
        resolve_target(capability="9.0")
    with pytest.raises(WarmdInputError, match="invalid compute capability"):
        resolve_target(capability="hopper", sms=1)


@pytest.mark.parametrize("name, capability, sms, message", [
    ("h200", "8.0", None, "--target h200 is sm_90, not --capability 8.0"),
    ("h200", None, 10, "--target h200 has 132 SMs, not --sms 10"),
    ("h200", "8.0", 10, "--target h200 is sm_90, not --capability 8.0"),
    ("b200", "sm_90a", 148, "--target b200 is sm_100, not --capability 9.0"),
    ("local", "9.0", 132, "--target local takes the local GPU's"),
    (None, None, 78, "--sms needs --capability"),
])
def test_conflicting_target_flags_are_refused(name, capability, sms, message):
    with pytest.raises(WarmdInputError, match=re.escape(message)):
        resolve_target(name, capability, sms)


def test_preset_flags_that_repeat_the_preset_are_accepted():
    h200 = resolve_target("h200")
    assert resolve_target("h200", "9.0", 132) == h200
    assert resolve_target("H200", "sm_90a", None) == h200
    assert resolve_target("h200", None, 132) == h200


def test_local_target_without_gpu_is_a_clear_error(monkeypatch):
    import warmd.targets as targets

    monkeypatch.setattr(targets, "detect_local_gpus", lambda: ())
    with pytest.raises(WarmdInputError, match="no local GPU found"):
        resolve_target(None)
    gpu = Target("NVIDIA H200", (9, 0), 132, count=8, source="nvml")
    monkeypatch.setattr(targets, "detect_local_gpus", lambda: (gpu,))
    assert resolve_target(None) is gpu


def test_m_value_modes():
    assert MSpec("full", 100).values(4096, 132) == list(range(1, 101))
    relax = relax_m_values(8192, 4096, 132)
    assert relax[:4] == [1, 2, 4, 8]
    assert 8192 in relax and max(relax) == 8192
    # wave boundary: 1 wave of 132 SMs, block_m 128, N=4096 in 256-wide blocks -> 16 n-blocks
    assert 132 * 128 // 16 in relax
    assert len(relax) < 8192 // 4
    fast = fast_m_values(8192)
    assert fast[:1024] == list(range(1, 1025)) and fast[-1] == 8192
    assert 1026 in fast and 1025 not in fast  # step 2 in [1024, 2048]
    assert 2052 in fast and 2050 not in fast  # step 4 in [2048, 4096]
    assert 4104 in fast and 4100 not in fast  # step 8 in [4096, 8192]
    explicit = parse_mspec("relax", 8192, "1,16,16,300")
    assert explicit.values(4096, 132) == [1, 16, 300]


def test_m_value_bad_input():
    with pytest.raises(WarmdInputError, match="--max-tokens"):
        parse_mspec("relax", 0)
    with pytest.raises(WarmdInputError, match="comma-separated"):
        parse_mspec("relax", 10, "1,x")
    with pytest.raises(WarmdInputError, match="unknown mode"):
        parse_mspec("turbo", 10)


def test_aligned_grouped_m_matches_vllm_worst_case():
    # DeepSeek-V3 TP=8: 8192 tokens, top-8, 256 local experts, 128-row blocks.
    assert aligned_grouped_m(8192, 8, 256) == 98048
    assert aligned_grouped_m(1, 8, 256) % 128 == 0
