"""`warmd plan` for another GPU: no local GPU needed, the libraries the engine ships assumed
for a preset and the missing ones noted, and without a GPU or --target one line suggesting
--target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from tests.plan_support import plan_json
from warmd.cli import main


def _absent_here(monkeypatch, *names: str) -> None:
    """This machine's probes, with `names` reported as not installed."""
    import warmd.libraries as registry
    from warmd.probes import LibraryProbe

    real = registry.probe_library

    def probe(name: str, engine: str | None = None) -> LibraryProbe:
        if name in names:
            return LibraryProbe(name, False, reason=f"{name} not installed (test)")
        return real(name, engine)

    monkeypatch.setattr(registry, "probe_library", probe)


def test_plan_for_a_preset_assumes_the_libraries_the_engine_ships(monkeypatch):
    """A plan for another GPU is for a node that runs the engine: vLLM 0.34.0 vendors
    DeepGEMM 2.8.1 and pins FlashInfer 0.7.3, whatever this machine has."""
    _absent_here(monkeypatch, "deep_gemm", "sgl_kernel")
    args = ["plan", "--target", "h200", "--", "vllm", "serve", "deepseek-v3",
            "--tensor-parallel-size", "8"]
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, args)
    assert result.exit_code == 0 and result.stderr == ""
    assert "Summary: 10 tasks (8 deep_gemm, 2 flashinfer)" in result.stdout
    assert _flat("vendored by vllm 0.34.0 (newest known): deep_gemm 2.8.1") in \
        _flat(result.stdout)
    data = json.loads(CliRunner().invoke(main, [*args[:3], "--json", *args[3:]]).stdout)
    assert data["assumed_on_target"]["from_engine"]["deep_gemm"] == {
        "version": "2.8.1", "why": "vendored by vllm 0.34.0 (newest known)"}
    assert data["assumed_on_target"]["from_engine"]["flashinfer"]["version"] == "0.7.3"
    assert data["libraries"]["deep_gemm"]["module"] == "vllm.third_party.deep_gemm"
    given = json.loads(CliRunner().invoke(main, [*args[:3], "--json", "--engine-version",
                                                 "0.34.0", *args[3:]]).stdout)
    assert given["libraries"]["deep_gemm"]["assumed"] == "vendored by vllm 0.34.0"
    # --without says otherwise: planned as if absent, as said
    without = json.loads(CliRunner().invoke(main, [*args[:3], "--json", "--without",
                                                   "deep_gemm", *args[3:]]).stdout)
    assert len(without["tasks"]) == 1 and "deep_gemm" in without["assumed_on_target"]["absent"]
    sglang = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3", "--tp", "8",
                                       "--target", "h200", "--engine", "sglang", "--json"])
    assert sglang.stderr == ""
    shipped = json.loads(sglang.stdout)["assumed_on_target"]["from_engine"]
    assert shipped["deep_gemm"]["version"] == "0.2.3.post2"
    assert shipped["sgl_kernel"]["why"] == "pinned by sglang 0.5.23 (newest known)"


def test_plan_for_a_release_warmd_has_no_data_for_notes_missing_libraries(monkeypatch):
    _absent_here(monkeypatch, "deep_gemm", "sgl_kernel")
    args = ["plan", "--model", "deepseek-v3", "--tp", "8", "--target", "h200",
            "--engine-version", "0.33.0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        "warmd: note: deep_gemm is not installed here; planning as if absent (pass --with "
        "deep_gemm to plan for a node that has it, or --without deep_gemm to confirm)"]
    assert "Summary: 1 tasks" in result.stdout  # planned as if absent
    for flag in ("--with", "--without"):
        quiet = CliRunner().invoke(main, [*args, flag, "deep_gemm", "--json"])
        assert quiet.exit_code == 0 and quiet.stderr == ""
    # sgl_kernel matters to SGLang's plan only
    sglang = CliRunner().invoke(main, [*args[:-2], "--engine", "sglang", "--engine-version",
                                       "0.5.22", "--json"])
    assert "deep_gemm, sgl_kernel are not installed here" in sglang.stderr
    assert "--with deep_gemm --with sgl_kernel" in sglang.stderr
    assert len(sglang.stderr.splitlines()) == 1 and json.loads(sglang.stdout)["tasks"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_plan_for_the_local_gpu_notes_nothing(monkeypatch):
    import warmd.targets as targets
    from warmd.targets import Target

    _absent_here(monkeypatch, "deep_gemm")
    local = Target("NVIDIA H200", (9, 0), 132, source="nvml")
    monkeypatch.setattr(targets, "detect_local_gpus", lambda: (local,))
    result = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3", "--tp", "8", "--json"])
    assert result.exit_code == 0 and result.stderr == ""


def test_planning_for_a_preset_never_looks_for_a_gpu(monkeypatch):
    import warmd.targets as targets

    def no_gpu_lookup():
        raise AssertionError("a preset plan looked for a local GPU")

    monkeypatch.setattr(targets, "detect_local_gpus", no_gpu_lookup)
    for args in (["--target", "h200"], ["--capability", "9.0", "--sms", "78"]):
        plan_json("--model", "deepseek-v3", "--tp", "8", *args)


def test_without_a_gpu_and_without_target_one_line_suggests_target():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, whatever the machine
    result = subprocess.run([sys.executable, "-m", "warmd", "plan", "--model", "llama-3.1-8b"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("warmd: error: no local GPU found") and "--target (a100" in line
    ok = subprocess.run([sys.executable, "-m", "warmd", "plan", "--model", "llama-3.1-8b",
                         "--target", "h200"], capture_output=True, text=True, timeout=120,
                        env=env)
    assert ok.returncode == 0 and "Target: NVIDIA H200" in ok.stdout
