"""Which DeepGEMM an engine imports, found the engine's way without importing anything: a
vLLM 0.34.0 layout on the path (its dist-info and vllm/third_party/deep_gemm, DeepGEMM 2.8.1
vendored), an external deep_gemm beside it, and what `warmd plan` then says."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warmd.libraries import probe_library
from warmd.libraries.deep_gemm.compiler import fast_path_problem
from warmd.libraries.deep_gemm.install import (
    EXTERNAL,
    VENDORED,
    DeepGemmInstall,
    Generation,
    generation_of,
    resolve,
)

ROOT = Path(__file__).resolve().parents[2]
SERVE = ["--", "vllm", "serve", "tests/data/models/qwen3-235b-a22b-fp8",
         "--tensor-parallel-size", "4"]
# Importing any of these packages ends the process: the probe must only look.
TRAP = "raise SystemExit('imported {name}: the probe must not import it')\n"


def vllm_0_34_layout(site: Path) -> Path:
    """vLLM 0.34.0 as its wheel installs it, reduced to what the probe may look at."""
    package = site / "vllm" / "third_party" / "deep_gemm"
    package.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(TRAP.format(name="vllm"))
    (site / "vllm" / "third_party" / "__init__.py").write_text(TRAP.format(name="third_party"))
    # The vendored __init__.py ends as 2.8.1's does, after code that must never run here.
    (package / "__init__.py").write_text(TRAP.format(name="deep_gemm")
                                         + "__version__ = '2.8.1'\n")
    (package / "include" / "deep_gemm").mkdir(parents=True)
    dist = site / "vllm-0.34.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    return package


def external_deep_gemm(site: Path, version: str = "0.1.4.post1") -> Path:
    """sgl-deep-gemm as its wheel installs it: the package with its VERSION file."""
    package = site / "deep_gemm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(TRAP.format(name="deep_gemm"))
    (package / "VERSION").write_text(version + "\n")
    return package


@pytest.fixture
def only_on_path(monkeypatch: pytest.MonkeyPatch):
    """Put sites first on sys.path and hide any vllm or deep_gemm this machine has."""
    def use(*sites: Path) -> None:
        kept = [p for p in sys.path if not any(
            (Path(p or ".") / name).exists() for name in ("vllm", "deep_gemm"))]
        monkeypatch.setattr(sys, "path", [*map(str, sites), *kept])
        importlib.invalidate_caches()
        probe_library.cache_clear()

    return use


def test_probe_finds_vllms_vendored_deep_gemm_without_importing(tmp_path, only_on_path):
    package = vllm_0_34_layout(tmp_path / "site")
    only_on_path(tmp_path / "site")
    for engine in ("vllm", None):  # without an engine: the order vLLM follows
        probe = probe_library("deep_gemm", engine)
        assert probe.available and probe.module == VENDORED
        assert probe.version == "2.8.1" and Path(probe.location) == package
    assert not {"vllm", "vllm.third_party", "deep_gemm"} & set(sys.modules)
    sglang = probe_library("deep_gemm", "sglang")  # SGLang imports deep_gemm only
    assert not sglang.available and "module deep_gemm" in sglang.reason
    assert resolve("vllm").generation is Generation.DEEP_JIT


def test_an_external_deep_gemm_comes_first_for_both_engines(tmp_path, only_on_path):
    vllm_0_34_layout(tmp_path / "vllm-site")
    package = external_deep_gemm(tmp_path / "site")
    only_on_path(tmp_path / "vllm-site", tmp_path / "site")
    for engine in ("vllm", "sglang", None):
        probe = probe_library("deep_gemm", engine)
        assert probe.module == EXTERNAL and Path(probe.location) == package
        assert probe.version == "0.1.4.post1"
    assert resolve().generation is Generation.NVCC_JIT
    assert "deep_gemm" not in sys.modules


def test_nothing_found_says_where_each_engine_looks(tmp_path, only_on_path):
    only_on_path(tmp_path)
    assert "vllm.third_party.deep_gemm" in probe_library("deep_gemm", "vllm").reason
    assert not probe_library("deep_gemm", "sglang").available


def test_generation_follows_the_version():
    assert generation_of("0.1.4.post1") is Generation.NVCC_JIT
    assert generation_of("2.6.1") is Generation.NVCC_JIT
    assert generation_of("2.8.1") is Generation.DEEP_JIT
    assert generation_of("2.8.0+cu130") is Generation.DEEP_JIT
    assert generation_of("0.2.3.post2") is Generation.DEEP_JIT  # SGLang 0.5.23's pin
    for unknown in ("2.7.0", "3.0.0", "0.3.0", "0.0.0.dev0", "not a version", None):
        assert generation_of(unknown) is None


def test_fast_path_problem_says_why_it_cannot_record():
    vendored = DeepGemmInstall(VENDORED, Path("/x"), "2.8.1")
    assert fast_path_problem(vendored, {}) is None
    assert fast_path_problem(vendored, {"DG_JIT_USE_NVRTC": "1"}) is None  # no NVRTC in 2.8
    future = DeepGemmInstall(VENDORED, Path("/x"), "3.0.0")
    assert "3.0.0" in fast_path_problem(future, {}) and "2.8.x" in fast_path_problem(future, {})
    old = DeepGemmInstall(EXTERNAL, Path("/x"), "0.1.4.post1")
    assert "NVRTC" in fast_path_problem(old, {"DG_JIT_USE_NVRTC": "1"})
    assert fast_path_problem(None, {}) is None


def _warmd(site: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "VLLM_MOE_USE_DEEP_GEMM": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "warmd", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_plan_from_a_serve_command_on_a_vllm_0_34_node_plans_deepgemm(tmp_path):
    """No separate DeepGEMM: the plan finds vLLM's own 2.8.1 and plans DeepGEMM tasks."""
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("an external deep_gemm is installed here: vLLM would import that one")
    vllm_0_34_layout(tmp_path / "site")
    text = _warmd(tmp_path / "site", "plan", "--target", "h200", *SERVE)
    assert text.returncode == 0, text.stderr
    assert "deep_gemm=yes 2.8.1 (vllm.third_party.deep_gemm)" in text.stdout
    assert "installed vllm 0.34.0" in text.stdout
    data = json.loads(_warmd(tmp_path / "site", "plan", "--target", "h200", "--json",
                             *SERVE).stdout)
    assert data["libraries"]["deep_gemm"]["module"] == VENDORED
    kernels = {t["kernel"] for t in data["tasks"] if t["library"] == "deep_gemm"}
    assert kernels == {"fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous"}
