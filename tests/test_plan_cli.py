"""`warmd plan` end to end: JSON shape, text table, bad input, and agreement with FlashInfer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from warmd.cli import main
from warmd.examples import example_names


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], capture_output=True,
                          text=True, timeout=120)


def plan_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_json_shape():
    data = plan_json("--model", "deepseek-v3", "--tp", "8", "--target", "h200",
                     "--with", "deep_gemm", "--without", "flashinfer")
    assert data["target"]["arch"] == "9.0a" and data["target"]["sms"] == 132
    for layer in data["layers"]:
        assert {"name", "n", "k", "num_groups", "count", "kernel", "rejected"} <= set(layer)
        for rejection in layer["rejected"]:
            assert set(rejection) == {"kernel", "reason"} and rejection["reason"]
    experts = next(layer for layer in data["layers"] if layer["name"] == "mlp.experts.w13")
    assert experts["num_groups"] == 256
    dense = next(layer for layer in data["layers"] if layer["name"] == "self_attn.o_proj")
    assert dense["num_groups"] is None
    assert data["tasks"]
    for task in data["tasks"]:
        assert {"library", "kernel", "n", "k", "num_groups", "m", "module", "key"} <= set(task)
        assert task["library"] in ("deep_gemm", "flashinfer")
        if task["library"] == "deep_gemm":
            assert task["m"] == sorted(set(task["m"])) and task["module"] is None
    keys = [t["key"] for t in data["tasks"]]
    assert len(keys) == len(set(keys))


def test_plan_keys_are_stable_across_runs_and_flag_order():
    first = plan_json("--model", "qwen3-30b-a3b-fp8", "--target", "h200", "--with", "deep_gemm")
    second = plan_json("--target", "h200", "--with", "deep_gemm", "--model",
                       "qwen3-30b-a3b-fp8")
    assert [t["key"] for t in first["tasks"]] == [t["key"] for t in second["tasks"]]
    assert first["plan_key"] == second["plan_key"]
    other = plan_json("--model", "qwen3-30b-a3b-fp8", "--target", "h20", "--with", "deep_gemm")
    assert first["plan_key"] != other["plan_key"]  # SM count changes DeepGEMM's kernels


def test_plan_text_output_lists_rejections():
    result = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--target", "b200",
                                       "--quantization", "mxfp8", "--without", "flashinfer"])
    assert result.exit_code == 0, result.output
    assert "EmulatedMxfp8LinearKernel" in result.output
    assert "FlashInfer unavailable" in result.output
    assert "Summary:" in result.output


def test_bundled_examples_all_plan():
    for name in example_names():
        plan_json("--model", name, "--target", "h100", "--with", "deep_gemm")


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/dir"], "model config not found"),
    (["--model", "llama-3.1-8b", "--tp", "3"], "--tp=3 does not divide"),
    # SGLang takes any EP size that divides the experts; vLLM only 1 or TP x DP.
    (["--model", "qwen3-30b-a3b-fp8", "--engine", "sglang", "--ep", "5"],
     "--ep=5 does not divide"),
    (["--model", "qwen3-30b-a3b-fp8", "--ep", "5"], "--ep must be 1 or 1 (--tp 1 x --dp 1)"),
    (["--model", "llama-3.1-8b", "--target", "h300"], "unknown target preset"),
    (["--model", "llama-3.1-8b", "--target", "h100", "--with", "cudnn"], "unknown library"),
    (["--model", "llama-3.1-8b", "--target", "h100", "--disable-kernel", "Nope"],
     "unknown kernel name"),
    (["--model", "llama-3.1-8b", "--target", "h100", "--max-tokens", "0"], "--max-tokens"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    result = run_cli("plan", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["plan", "--model", "llama-3.1-8b", "--tp", "abc"], "'abc' is not a valid integer"),
    (["plan"], "Missing option '--model'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["wait-ready", "--timeout", "nan"], "must be a finite number >= 0"),
    (["status", "--watch", "--interval", "-1"], "must be a finite number >= 0"),
    (["plan", "--model", "llama-3.1-8b", "--capability", "9.0", "--sms", "-1"],
     "--sms must be a positive integer"),
])
def test_usage_errors_are_one_line_exit_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("warmd: error:")


def test_malformed_and_unsupported_configs(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2")
    result = run_cli("plan", "--model", str(tmp_path), "--target", "h100")
    assert result.returncode == 2 and "not valid JSON" in result.stderr
    bad.write_text(json.dumps({"model_type": "bert"}))
    result = run_cli("plan", "--model", str(bad), "--target", "h100")
    assert result.returncode == 2
    assert "supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral" in result.stderr
    bad.chmod(0)
    if not bad.stat().st_mode & 0o400 and subprocess.run(["id", "-u"], capture_output=True,
                                                         text=True).stdout.strip() != "0":
        result = run_cli("plan", "--model", str(bad), "--target", "h100")
        assert result.returncode == 2 and "cannot read" in result.stderr


def test_planner_imports_no_gpu_library():
    code = ("import sys; from warmd.plan import PlanRequest, make_plan;"
            "make_plan(PlanRequest('deepseek-v3', tp=8, target='h200', with_libs=('deep_gemm',"
            "'flashinfer')));"
            "bad = [m for m in ('torch', 'flashinfer', 'deep_gemm', 'ray') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_help_reads_well():
    result = CliRunner().invoke(main, ["plan", "--help"])
    assert result.exit_code == 0
    for flag in ("--model", "--tp", "--ep", "--target", "--with", "--without", "--engine",
                 "--mode", "--max-tokens", "--json"):
        assert flag in result.output


_SPEC_CHECK = """
import importlib, json, sys
import torch
names = []
for task in json.load(sys.stdin):
    module_name, func_name = task["spec"]["generator"].split(":")
    generator = getattr(importlib.import_module(module_name), func_name)
    args = [getattr(torch, a) if a in ("bfloat16", "int32") else a for a in task["spec"]["args"]]
    names.append([task["module"], generator(*args).name])
print(json.dumps(names))
"""


def test_planned_flashinfer_modules_match_flashinfer_spec_names(tmp_path):
    """The planner names FlashInfer modules without importing it; FlashInfer must agree."""
    pytest.importorskip("flashinfer", reason="FlashInfer names are checked where it is installed")
    plans = [
        plan_json("--model", "llama-3.1-8b", "--target", "b200", "--quantization", "mxfp8",
                  "--with", "flashinfer", "--engine", "sglang"),
        plan_json("--model", "deepseek-v3", "--tp", "8", "--target", "h200", "--with",
                  "flashinfer", "--with", "deep_gemm", "--disable-kernel", "FlashMLABackend"),
        plan_json("--model", "llama-3.1-8b", "--target", "h200", "--with", "flashinfer",
                  "--disable-kernel", "FlashAttentionBackend"),
    ]
    tasks = [t for data in plans for t in data["tasks"] if t["library"] == "flashinfer"]
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
           "FLASHINFER_CUDA_ARCH_LIST": "9.0a 10.0a"}
    result = subprocess.run([sys.executable, "-c", _SPEC_CHECK], input=json.dumps(tasks),
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    pairs = json.loads(result.stdout.strip().splitlines()[-1])
    for planned, actual in pairs:
        assert planned == actual
    checked = {planned for planned, _ in pairs}
    assert {"silu_and_mul", "mxfp8_gemm_cutlass", "fp8_blockscale_gemm_90", "sampling"} <= checked
    assert any(m.startswith("batch_prefill_with_kv_cache") for m in checked)
    assert any(m.startswith("batch_decode_with_kv_cache") for m in checked)
    assert any(m.startswith("batch_mla_attention") for m in checked)
