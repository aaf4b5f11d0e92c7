"""`warmd plan` end to end: JSON shape, text table, bad input, and agreement with FlashInfer
(for another GPU: test_plan_cli_targets.py; its tables: test_plan_cli_tables.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.plan_support import plan_json
from warmd.cli import main
from warmd.examples import example_names


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], capture_output=True,
                          text=True, timeout=120)


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
    assert "MarlinMxfp8LinearKernel" in result.output  # vLLM 0.34.0 without FlashInfer
    assert "FlashInfer unavailable" in result.output
    assert "Summary:" in result.output


def test_bundled_examples_all_plan():
    for name in example_names():
        plan_json("--model", name, "--target", "h100", "--with", "deep_gemm")


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/dir"], "model config not found"),
    # a mistyped bundled name lists the bundled names
    (["--model", "deepseek-v4", "--target", "h200"], "no bundled model of that name; "
     "bundled: deepseek-v3, llama-3.1-8b, mixtral-8x7b, qwen3-30b-a3b-fp8"),
    (["--target", "h200", "--", "vllm", "serve", "llama3"], "bundled: deepseek-v3,"),
    # an engine's flag given to warmd: its own option, and the serve-command form
    (["--model", "llama-3.1-8b", "--tensor-parallel-size", "8"],
     "--tensor-parallel-size is vLLM's flag, not warmd plan's: use --tp, or give the serve "
     "command after --: warmd plan -- vllm serve MODEL --tensor-parallel-size ..."),
    (["--tp-size=8"], "--tp-size is SGLang's flag, not warmd plan's: use --tp"),
    (["--enforce-eager"], "--enforce-eager is vLLM's flag, not warmd plan's: give the serve "
     "command after --"),
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
    (["--model", "llama-3.1-8b", "--target", "h200", "--capability", "8.0", "--sms", "10"],
     "--target h200 is sm_90, not --capability 8.0"),
    (["--model", "llama-3.1-8b", "--target", "h200", "--sms", "10"],
     "--target h200 has 132 SMs, not --sms 10"),
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
        # (without sgl-kernel, which SGLang pins: its activation is then FlashInfer's)
        plan_json("--model", "llama-3.1-8b", "--target", "b200", "--quantization", "mxfp8",
                  "--with", "flashinfer", "--engine", "sglang", "--without", "sgl_kernel"),
        # SGLang's flashinfer MLA builds batch_mla on Hopper (vLLM's FLASHINFER_MLA is sm100
        # TRT-LLM-gen only: docs/selection.md).
        plan_json("--model", "deepseek-v3", "--tp", "8", "--target", "h200", "--with",
                  "flashinfer", "--with", "deep_gemm", "--disable-kernel", "FlashMLABackend",
                  "--disable-kernel", "FlashAttnMLABackend", "--engine", "sglang"),
        plan_json("--model", "deepseek-v3", "--tp", "8", "--target", "h200", "--with",
                  "flashinfer", "--with", "deep_gemm"),
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


# ----- the plan key: the model and the request, not only the tasks -----

def test_plan_key_names_the_model_and_the_request(tmp_path):
    none = ("--without", "deep_gemm", "--without", "flashinfer", "--target", "h100")
    base = plan_json("--model", "llama-3.1-8b", *none)
    assert base["tasks"] == []  # nothing to JIT: the tasks alone cannot tell plans apart
    others = [plan_json("--model", "mixtral-8x7b", *none),
              plan_json("--model", "llama-3.1-8b", "--tp", "2", *none),
              plan_json("--model", "llama-3.1-8b", "--engine", "sglang", *none),
              plan_json("--model", "llama-3.1-8b", "--mode", "full", *none),
              plan_json("--model", "llama-3.1-8b", "--m-list", "1,2,4", *none),
              plan_json("--model", "llama-3.1-8b", *none[:4], "--target", "b200")]
    keys = [base["plan_key"]] + [o["plan_key"] for o in others]
    assert len(set(keys)) == len(keys), keys
    # the same model elsewhere on disk is the same plan; another config is another model
    copy = tmp_path / "llama"
    copy.mkdir()
    config = json.loads((Path(base["model"]["path"])).read_text())
    (copy / "config.json").write_text(json.dumps(config, indent=4))
    assert plan_json("--model", str(copy), *none)["plan_key"] == base["plan_key"]
    config["rope_theta"] = 1.0
    (copy / "config.json").write_text(json.dumps(config))
    assert plan_json("--model", str(copy), *none)["plan_key"] != base["plan_key"]


# ----- warmup: empty selections, --from-config without --model -----

QWEN_SGLANG = ["-m", "qwen3-30b-a3b-fp8", "-t", "h200", "--engine", "sglang", "--with",
               "flashinfer", "--without", "sgl_kernel", "--without", "deep_gemm", "--no-shared"]


@pytest.mark.parametrize("args, message", [
    (["--task-filter", "no_such_kernel"], "--task-filter 'no_such_kernel' matched none of the "
                                          "plan's"),
    (["--library", "deep_gemm"], "--library deep_gemm matched none of the plan's"),
    (["--library", "deep_gemm", "--task-filter", "nothing"],
     "--library deep_gemm and --task-filter 'nothing' matched none"),
])
def test_warmup_selecting_nothing_is_exit_2_naming_the_filters(args, message, tmp_path):
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    result = subprocess.run([sys.executable, "-m", "warmd", "warmup", *QWEN_SGLANG, *args],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("warmd: error: ") and message in line, line
    assert "(libraries: flashinfer; keys: `warmd plan`)" in line
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()


def test_warmup_filters_that_match_apart_but_not_together():
    plan_args = ["-m", "qwen3-30b-a3b-fp8", "-t", "h200", "--engine", "sglang", "--with",
                 "flashinfer", "--without", "sgl_kernel", "--with", "deep_gemm"]
    args = [*plan_args, "--no-shared"]
    tasks = plan_json(*plan_args)["tasks"]
    assert {t["library"] for t in tasks} == {"deep_gemm", "flashinfer"}
    result = CliRunner().invoke(main, ["warmup", *args, "--library", "flashinfer",
                                       "--task-filter", "^deep_gemm/"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"warmd: error: --task-filter '^deep_gemm/' with --library flashinfer matched none of "
        f"the plan's {len(tasks)} tasks (libraries: deep_gemm, flashinfer; keys: `warmd plan`)")


def test_warmup_help_and_model_with_and_without_from_config():
    help_text = CliRunner().invoke(main, ["warmup", "--help"]).output
    model_help = help_text[help_text.index("--model"):help_text.index("--tp")]
    assert "[required]" not in model_help and "Not used with --from-config" in model_help
    missing = CliRunner().invoke(main, ["warmup", "--target", "h200"])
    assert missing.exit_code == 2
    assert missing.stderr.startswith("warmd: error: Missing option '--model'")
    both = CliRunner().invoke(main, ["warmup", "--from-config", "warmd/examples/warmd.yaml",
                                     "--model", "llama-3.1-8b", "--tp", "2", "--with",
                                     "deep_gemm"])
    assert both.exit_code == 2 and len(both.stderr.strip().splitlines()) == 1
    assert "drop --model, --tp, --with" in both.stderr
    # the README's pre-join example names a file that exists, relative to the repository
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for line in readme.splitlines():
        if "--from-config" in line and line.startswith("warmd warmup"):
            assert (Path(__file__).parents[2] / line.split()[3]).is_file(), line


QWEN_TP2 = ("--target", "h200", "--with", "deep_gemm", "--", "vllm", "serve",
            "qwen3-30b-a3b-fp8", "--tensor-parallel-size", "2")


def test_plan_names_the_triton_moe_the_engine_compiles_and_no_executor_for_it():
    # vLLM >= 0.17 on Hopper, block FP8 under TP: TritonExperts (fused_moe/oracle/fp8.py);
    # its configs: the tuned table E=128,N=384,H200 (fused_moe.py get_moe_configs).
    data = plan_json(*QWEN_TP2)
    w13 = next(layer for layer in data["layers"] if layer["name"] == "mlp.experts.w13")
    assert w13["kernel"] == "TritonExperts"
    [line] = w13["engine_jit"]
    assert line.startswith("Triton fused MoE: 18 configs (M buckets 1, 2, 4,")
    assert "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]" in line
    assert line.endswith("no executor here")
    assert all(not layer["engine_jit"] for layer in data["layers"]
               if layer["name"] not in ("mlp.experts.w13", "mlp.experts.w2", "mlp.gate"))
    # vLLM 0.34.0's router GEMM (GateLinear: CuTe DSL when it computes in FP32).
    gate = next(layer for layer in data["layers"] if layer["name"] == "mlp.gate")
    assert all(line.startswith("CuTe-DSL router GEMM") for line in gate["engine_jit"])
    text = CliRunner().invoke(main, ["plan", *QWEN_TP2]).output
    assert "Left to the engine" in text and "  mlp.experts.w2: Triton fused MoE" in text


def test_triton_moe_buckets_follow_the_plans_tokens():
    from warmd.engines.triton_moe import moe_configs

    # The closest batch size: M 100 runs 96's config, 128's from M 113 (ties: the smaller).
    small = moe_configs(128, 384, "NVIDIA H200", "fp8_w8a8", (128, 128), 1, 112)
    assert small.tuned and small.buckets == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96)
    assert moe_configs(128, 384, "NVIDIA H200", "fp8_w8a8", (128, 128), 113, 113).buckets \
        == (128,)
    # No tuned table: get_default_config's block-FP8 buckets.
    default = moe_configs(7, 384, "NVIDIA H200", "fp8_w8a8", (128, 128), 1, 8192)
    assert not default.tuned and default.buckets == (1, 5, 9, 17, 65)


def test_a_plan_for_a_preset_says_which_libraries_it_assumes():
    data = plan_json(*QWEN_TP2[:4], "--without", "flashinfer", "--model", "qwen3-30b-a3b-fp8")
    assert "deep_gemm" in data["assumed_on_target"]["present"]
    assert "flashinfer" in data["assumed_on_target"]["absent"]
    text = CliRunner().invoke(main, ["plan", *QWEN_TP2[:4], "--without", "flashinfer",
                                     "--model", "qwen3-30b-a3b-fp8"]).output
    [line] = [x for x in text.splitlines() if x.startswith("Assumed on the target:")]
    assert "deep_gemm" in line and "not: " in line and "flashinfer" in line.split("not: ")[1]


def test_rejection_reasons_are_one_line_each_and_relevant():
    result = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3", "--tp", "8",
                                       "--target", "h200", "--without", "deep_gemm"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for line in result.output.splitlines():
        assert line.count("DeepGEMM unavailable") <= 1, line
    # SGLang with its MoE on Triton: DeepEP's kernel is rejected for not running DeepEP, not
    # for a missing DeepGEMM.
    data = plan_json("--engine", "sglang", "--model", "qwen3-30b-a3b-fp8", "--tp", "2",
                     "--target", "h200", "--without", "deep_gemm")
    w13 = next(layer for layer in data["layers"] if layer["name"] == "mlp.experts.w13")
    assert w13["kernel"] == "TritonExperts"
    [deepep] = [r["reason"] for r in w13["rejected"] if r["kernel"] == "DeepEPDeepGemmExperts"]
    assert "only with DeepEP" in deepep and "DeepGEMM unavailable" not in deepep


def test_shipped_library_data_names_libraries_and_releases_warmd_follows():
    """Every library the engines' release data names is one warmd probes, and every
    release is one whose flags warmd follows (the newest it has data for)."""
    from warmd.engines.cli_args import FOLLOWED
    from warmd.engines.shipped import shipped_release
    from warmd.engines.versions import parse_version
    from warmd.libraries import probe_names

    for engine, release in FOLLOWED.items():
        shipped = shipped_release(engine, parse_version(release))
        assert shipped is not None and shipped.release == release and not shipped.newest
        assert {lib.name for lib in shipped.libraries} <= set(probe_names())
        assert {"deep_gemm", "flashinfer"} <= {lib.name for lib in shipped.libraries}
        assert shipped_release(engine, None).newest
    assert shipped_release("vllm", (0, 20, 0)) is None  # no data: this machine's libraries
