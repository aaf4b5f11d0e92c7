"""Backends planned as the engines choose them: vLLM's FP8 MoE oracle per release
(fused_moe/oracle/fp8.py and, before 0.13.0, quantization/fp8.py), its attention priorities
(platforms/cuda.py), and FlashInfer's fused-MoE modules as tasks when a FlashInfer MoE backend
is chosen (SGLang's choices: test_backends_sglang.py). Published configs live in
tests/data/models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plan_support import (
    BASE,
    assert_refused_in_one_line,
    experts,
    from_command,
    from_flags,
    model,
    modules,
    rejections,
    selection,
)
from warmd.engines.moe_backends import ORACLE_ROWS, oracle_row
from warmd.errors import WarmdInputError
from warmd.plan import PlanRequest, engine_jit, make_plan

QWEN = "vllm serve {qwen3_30b_a3b_fp8} "
KIMI = "vllm serve {kimi_k2_instruct} -tp 8 --max-num-batched-tokens 1024 "

# (serve command, model directory, equivalent flags): each backend flag of the engines.
FLAG_CASES = [
    (QWEN + "-tp 2 --moe-backend flashinfer_cutlass", "qwen3-30b-a3b-fp8",
     dict(tp=2, moe_backend="flashinfer_cutlass")),
    (QWEN + "-tp 2 --moe-backend=DEEP-GEMM", "qwen3-30b-a3b-fp8",
     dict(tp=2, moe_backend="deep_gemm")),
    (QWEN + "-tp 4 -ep --moe-backend triton", "qwen3-30b-a3b-fp8",
     dict(tp=4, ep=4, moe_backend="triton")),
    (KIMI + "--attention-backend FLASHMLA", "kimi-k2-instruct",
     dict(tp=8, max_tokens=1024, attention_backend="FLASHMLA")),
    ("vllm serve {llama_3_1_8b_instruct} --attention-backend FLASHINFER", "llama-3.1-8b-instruct",
     dict(attention_backend="FLASHINFER")),
    ("vllm serve {mixtral_8x7b_instruct} -tp 8 --moe-backend triton "
     "--attention-backend TRITON_ATTN", "mixtral-8x7b-instruct",
     dict(tp=8, moe_backend="triton", attention_backend="TRITON_ATTN")),
    ("vllm serve {mistral_small_3_1_24b_instruct_2503} -tp 2 --attention-backend FLASH_ATTN",
     "mistral-small-3.1-24b-instruct-2503", dict(tp=2, attention_backend="FLASH_ATTN")),
    ("vllm serve {llama_3_1_8b_instruct_fp8_dynamic} --attention-backend TRITON_ATTN",
     "llama-3.1-8b-instruct-fp8-dynamic", dict(attention_backend="TRITON_ATTN")),
    ("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} --tp 4 "
     "--moe-a2a-backend deepep --moe-runner-backend triton --attention-backend fa3",
     "qwen3-30b-a3b-fp8", dict(engine="sglang", tp=4, ep=4, moe_a2a_backend="deepep",
                               moe_backend="triton", attention_backend="fa3")),
    ("python -m sglang.launch_server --model-path {kimi_k2_instruct} --tp 8 "
     "--moe-runner-backend flashinfer_cutlass", "kimi-k2-instruct",
     dict(engine="sglang", tp=8, moe_backend="flashinfer_cutlass")),
]


@pytest.mark.parametrize("command, name, flags", FLAG_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(FLAG_CASES)])
def test_backend_flags_plan_what_the_equivalent_flags_plan(command, name, flags):
    pasted = from_command(command)
    assert pasted.to_json() == from_flags(name, **flags).to_json()


def test_oracle_rows_cover_every_release_once():
    for version in [(0, 9, 0), (0, 11, 2), (0, 12, 0), (0, 13, 0), (0, 14, 1), (0, 15, 1),
                    (0, 16, 0), (0, 17, 0), (0, 23, 0), (0, 24, 0), (1, 0, 0), None]:
        assert sum(row.versions.contains(version) for row in ORACLE_ROWS) == 1
    assert oracle_row((0, 16, 0)).hopper_block_rule is False
    assert oracle_row((0, 17, 0)).hopper_block_rule is True


def test_newest_vllm_hopper_block_fp8_tp_runs_triton_moe():
    # oracle/fp8.py >= 0.17.0: "On Hopper for Block Fp8, prefer Triton for TP".
    plan = from_command(QWEN + "-tp 2")
    assert experts(plan).kernel.name == "TritonExperts"
    assert not [t for t in plan.tasks if t.num_groups]  # no DeepGEMM grouped GEMM warmed
    assert "fused_moe_90" not in modules(plan)
    assert any("tries TRITON first" in n for n in plan.engine_notes)


def test_newest_vllm_hopper_block_fp8_ep_plans_the_flashinfer_cutlass_module():
    # ... "and FI CUTLASS for EP": FlashInfer's cutlass_fused_moe, module fused_moe_90.
    plan = from_command(QWEN + "-tp 2 -dp 2 -ep")
    assert experts(plan).kernel.name == "FlashInferExperts"
    task = next(t for t in plan.tasks if t.module == "fused_moe_90")
    assert task.library == "flashinfer" and set(task.layers) == {"mlp.experts.w13",
                                                                 "mlp.experts.w2"}
    assert task.spec["generator"] == \
        "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm90_module"
    assert not [t for t in plan.tasks if t.num_groups]
    assert any("expert parallel (EP 4)" in n for n in plan.engine_notes)


def test_without_flashinfer_the_ep_oracle_falls_to_deepgemm_with_reasons():
    plan = from_command(QWEN + "-tp 2 -dp 2 -ep", without_libs=("flashinfer",),
                        with_libs=("deep_gemm", "nvcc"))
    sel = experts(plan)
    assert sel.kernel.name == "DeepGemmExperts"
    reasons = rejections(sel)
    assert "FlashInfer unavailable" in reasons["FlashInferExperts"]
    assert "needs sm10x" in reasons["TrtLlmFp8Experts"]
    assert "VLLM_USE_DEEP_GEMM_E8M0" in reasons["TritonOrDeepGemmExperts"]


@pytest.mark.parametrize("version, command, kernel, note", [
    # 0.16.0: one priority list for every GPU, FlashInfer first; TRT-LLM needs sm100.
    ("0.16.0", QWEN + "-tp 2", "FlashInferExperts", None),
    # 0.12.0 - 0.15.x: FlashInfer only on request; DeepGEMM unless the MoE's TP size >= 8.
    ("0.14.0", QWEN + "-tp 2", "DeepGemmExperts", None),
    ("0.14.0", KIMI, "TritonExperts", "MoE TP size 8 >= 8"),
    ("0.14.0", QWEN + "-tp 8 -ep", "DeepGemmExperts", None),  # with EP the MoE's TP size is 1
    # before 0.12.0: DeepGEMM for block FP8 whenever VLLM_USE_DEEP_GEMM is on.
    ("0.11.0", KIMI, "DeepGemmExperts", None),
    ("0.12.0", KIMI, "TritonExperts", "MoE TP size 8 >= 8"),
])
def test_older_oracles(version, command, kernel, note):
    plan = from_command(command, engine_version=version)
    assert experts(plan).kernel.name == kernel
    if note:
        assert any(note in n for n in plan.engine_notes), plan.engine_notes
    if kernel == "FlashInferExperts":
        assert "needs sm10x" in rejections(experts(plan))["TrtLlmFp8Experts"]


def test_blackwell_before_0_14_falls_to_cutlass_block_grouped_gemm():
    # quantization/fp8.py (0.12.0, 0.13.0): DeepGEMM, then CUTLASS block-scaled grouped GEMM
    # on sm100 (compiled into vLLM: nothing to warm), then Triton.
    with_dg = from_command(QWEN + "-tp 2", target="b200", engine_version="0.13.0")
    assert experts(with_dg).kernel.name == "DeepGemmExperts"
    plan = from_command(QWEN + "-tp 2", target="b200", engine_version="0.13.0",
                        with_libs=("flashinfer", "nvcc"), without_libs=("deep_gemm",))
    assert experts(plan).kernel.name == "CutlassBlockScaledGroupedGemmExperts"
    assert "DeepGEMM unavailable" in rejections(experts(plan))["DeepGemmExperts"]
    hopper = from_command(QWEN + "-tp 2", engine_version="0.13.0", without_libs=("deep_gemm",),
                          with_libs=("flashinfer", "nvcc"))
    assert experts(hopper).kernel.name == "TritonExperts"
    assert "needs sm10x" in rejections(experts(hopper))["CutlassBlockScaledGroupedGemmExperts"]


def test_blackwell_block_fp8_runs_flashinfer_trtllm():
    # FLASHINFER_TRTLLM first; FlashInferExperts takes block FP8 on sm90 only.
    plan = from_command(QWEN + "-tp 2", target="b200")
    assert experts(plan).kernel.name == "TrtLlmFp8Experts"
    assert "fused_moe_trtllm_sm100" in modules(plan)


@pytest.mark.parametrize("version, env, kernel, says", [
    ("0.23.0", (("VLLM_USE_FLASHINFER_MOE_FP8", "0"),), "DeepGemmExperts",
     "VLLM_USE_FLASHINFER_MOE_FP8=0: no FlashInfer MoE"),
    ("0.24.0", (("VLLM_USE_FLASHINFER_MOE_FP8", "0"),), "FlashInferExperts", None),  # not read
    (None, (("VLLM_USE_DEEP_GEMM", "1"),), "DeepGemmExperts", "set explicitly: MoE runs DEEPGEMM"),
    ("0.11.0", (("VLLM_USE_FLASHINFER_MOE_FP8", "1"),), "FlashInferExperts",
     "VLLM_FLASHINFER_MOE_BACKEND=throughput"),
    ("0.14.0", (("VLLM_USE_FLASHINFER_MOE_FP8", "1"),), "FlashInferExperts",
     "VLLM_FLASHINFER_MOE_BACKEND=latency"),  # latency off sm100 is CUTLASS
])
def test_engine_variables_move_the_moe_backend(version, env, kernel, says):
    plan = from_command(QWEN + "-tp 2 -dp 2 -ep", engine_version=version, engine_env=env)
    assert experts(plan).kernel.name == kernel
    if says:
        assert any(says in n for n in plan.engine_notes), plan.engine_notes


def test_bf16_moe_keeps_triton_and_ignores_the_fp8_oracle():
    plan = from_command("vllm serve {mixtral_8x7b_instruct} -tp 8 -ep --moe-backend deep_gemm")
    assert experts(plan).kernel.name == "TritonExperts"


@pytest.mark.parametrize("target, version, kernel", [
    ("h200", None, "FlashAttnMLABackend"),  # FLASH_ATTN_MLA first on Hopper since 0.14.0
    ("b200", None, "FlashInferMLABackend"),  # FLASHINFER_MLA first on sm100 since 0.16.0
    ("b200", "0.14.0", "CutlassMLABackend"),  # CUTLASS_MLA first before
])
def test_vllm_mla_backend_follows_the_release(target, version, kernel):
    plan = from_command(KIMI, target=target, engine_version=version)
    sel = selection(plan, "self_attn.attn")
    assert sel.kernel.name == kernel
    # vLLM >= 0.33.0's FLASHINFER_MLA decodes with TRT-LLM-gen (rule
    # vllm-flashinfer-mla-sm100): no batch_mla module, a line on what the engine loads.
    assert not any(m.startswith("batch_mla_attention") for m in modules(plan))
    left = engine_jit(sel, plan.env, plan.mspec)
    assert bool(left) == (kernel == "FlashInferMLABackend")
    assert not left or "TRT-LLM-gen MLA decode" in left[0]


def test_vllm_refuses_flashinfer_mla_on_hopper_and_so_does_warmd():
    with pytest.raises(WarmdInputError, match="--attention-backend FLASHINFER_MLA cannot run "
                                              "self_attn.attn here.*sm100 only"):
        from_command(KIMI + "--attention-backend FLASHINFER_MLA")
    on_b200 = from_command(KIMI + "--attention-backend FLASHINFER_MLA", target="b200")
    assert selection(on_b200, "self_attn.attn").kernel.name == "FlashInferMLABackend"


def test_vllm_flashinfer_mha_on_blackwell_runs_trtllm_gen():
    # vllm/utils/flashinfer.py supports_trtllm_attention: sm100 prefill and decode, sm120
    # decode only; FA2 modules only where FlashInfer's own kernels still run.
    llama = "vllm serve {llama_3_1_8b_instruct}"
    b200 = from_command(llama, target="b200")
    attn = selection(b200, "self_attn.attn")
    assert attn.kernel.name == "FlashInferAttentionBackend"
    assert not {m for m in modules(b200) if m.startswith("batch_")}
    assert "TRT-LLM-gen attention (prefill and decode)" in \
        engine_jit(attn, b200.env, b200.mspec)[0]
    rtx = from_command(llama, target="rtx-pro-6000")
    assert {m.split("_with")[0] for m in modules(rtx) if m.startswith("batch_")} == \
        {"batch_prefill"}

def test_vllm_attention_backend_variable_is_read_until_0_16():
    env = (("VLLM_ATTENTION_BACKEND", "FLASHINFER_MLA"),)
    old = from_command(KIMI, engine_env=env, engine_version="0.15.0")
    assert selection(old, "self_attn.attn").kernel.name == "FlashInferMLABackend"
    new = from_command(KIMI, engine_env=env)
    assert selection(new, "self_attn.attn").kernel.name == "FlashAttnMLABackend"
    assert any("not read by this vLLM" in n for n in new.engine_notes)


def test_forced_backend_that_cannot_run_is_refused():
    with pytest.raises(WarmdInputError, match="--moe-backend flashinfer_trtllm cannot run"):
        from_command(QWEN + "-tp 2 --moe-backend flashinfer_trtllm")  # sm100 only
    with pytest.raises(WarmdInputError, match="not a flag of vLLM"):
        from_command(QWEN + "-tp 2 --moe-backend triton", engine_version="0.16.0")
    with pytest.raises(WarmdInputError, match="warmd plans FP8 MoE for"):
        make_plan(PlanRequest(**{**BASE.__dict__, "model": model("qwen3-30b-a3b-fp8"),
                                 "moe_backend": "marlin"}))


@pytest.mark.parametrize("argv, message", [
    (["vllm", "serve", "{m}", "--moe-backend", "bogus"],
     "argument --moe-backend: invalid choice: 'bogus'"),
    (["python", "-m", "sglang.launch_server", "--model-path", "{m}", "--moe-runner-backend",
      "bogus"], "argument --moe-runner-backend: invalid choice: 'bogus'"),
    (["vllm", "serve", "{m}", "--attention-backend", "BOGUS"], "unknown attention backend"),
    (["python", "-m", "sglang.launch_server", "--model-path", "{m}", "--attention-backend",
      "fa9"], "argument --attention-backend: invalid choice: 'fa9'"),
    (["vllm", "serve", "{m}", "-tp", "2", "--moe-backend", "flashinfer_trtllm"],
     "cannot run mlp.experts"),
])
def test_bad_backend_is_one_line_exit_2(argv, message, tmp_path):
    argv = [a.format(m=model("qwen3-30b-a3b-fp8")) for a in argv]
    assert_refused_in_one_line(tmp_path, "plan", argv, message)


_SPEC_NAMES = """
import importlib, json, sys
out = []
for generator, args in json.load(sys.stdin):
    module, func = generator.split(":")
    out.append(getattr(importlib.import_module(module), func)(*args).name)
print(json.dumps(out))
"""


def test_fused_moe_module_name_resolves_through_flashinfer(tmp_path):
    """The planned CUTLASS fused-MoE module is the one FlashInfer's own generator names (its
    spec only: a full build compiles ~250 CUTLASS sources, too long for a test)."""
    pytest.importorskip("flashinfer", reason="FlashInfer names are checked where it is installed")
    plan = from_command(QWEN + "-tp 2 -ep")
    tasks = [t for t in plan.tasks if t.kernel == "cutlass_fused_moe"]
    assert [t.module for t in tasks] == ["fused_moe_90"]
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
           "FLASHINFER_CUDA_ARCH_LIST": "9.0a"}
    result = subprocess.run([sys.executable, "-c", _SPEC_NAMES],
                            input=json.dumps([[t.spec["generator"], list(t.spec["args"])]
                                              for t in tasks]),
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["fused_moe_90"]
    # On an H20 FlashInfer builds its prebuilt-descriptor variant; the plan names that one.
    h20 = from_command(QWEN + "-tp 2 -ep", target="h20")
    assert "fused_moe_90_h20_prebuilt_d" in modules(h20)


def _plan_cli(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "warmd", "plan", "--json", "--target", "h200",
                             "--with", "flashinfer", "--with", "deep_gemm", "--with", "nvcc",
                             *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cli_moe_backend_flag_equals_the_serve_command():
    qwen = model("qwen3-30b-a3b-fp8")
    flags = _plan_cli("--model", qwen, "--tp", "2", "--moe-backend", "flashinfer_cutlass",
                      "--engine-version", "0.20.0")
    pasted = _plan_cli("--engine-version", "0.20.0", "--", "vllm", "serve", qwen, "-tp", "2",
                       "--moe-backend", "flashinfer_cutlass")
    assert flags == pasted
    assert {t["module"] for t in flags["tasks"]} >= {"fused_moe_90"}


# ----- FP8 MoE with static per-tensor scales (rule vllm-fi-moe-static-tensor) -----

MIXTRAL = json.loads((Path(__file__).parents[1] / "data" / "models" / "mixtral-8x7b-instruct"
                      / "config.json").read_text())


def _mixtral_fp8(write_config, scheme: str):
    return str(write_config({**MIXTRAL, "quantization_config": {
        "quant_method": "fp8", "activation_scheme": scheme}}))


@pytest.mark.parametrize("target,kernel,module", [
    ("h200", "FlashInferExperts", "fused_moe_90"),
    ("b200", "TrtLlmFp8Experts", "fused_moe_trtllm_sm100"),  # FLASHINFER_TRTLLM first
    ("rtx-pro-6000", "FlashInferExperts", "fused_moe_120"),
])
def test_static_per_tensor_fp8_moe_runs_flashinfer_fused_moe(write_config, target, kernel,
                                                              module):
    plan = make_plan(PlanRequest(**{**BASE.__dict__, "model": _mixtral_fp8(write_config,
                                                                            "static"),
                                    "tp": 2, "target": target}))
    assert experts(plan).kernel.name == kernel
    assert module in modules(plan)


def test_dynamic_per_tensor_fp8_moe_stays_on_triton(write_config):
    plan = make_plan(PlanRequest(**{**BASE.__dict__, "model": _mixtral_fp8(write_config,
                                                                            "dynamic"),
                                    "tp": 2}))
    assert experts(plan).kernel.name == "TritonExperts"
    assert "static activation scales" in rejections(experts(plan))["FlashInferExperts"]


def test_static_activations_with_block_fp8_are_refused_as_vllm_refuses(write_config):
    bad = str(write_config({**MIXTRAL, "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "static",
        "weight_block_size": [128, 128]}}))
    with pytest.raises(WarmdInputError, match="only the dynamic activation_scheme"):
        make_plan(PlanRequest(**{**BASE.__dict__, "model": bad}))
    odd = str(write_config({**MIXTRAL, "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "sometimes"}}))
    with pytest.raises(WarmdInputError, match="static or dynamic"):
        make_plan(PlanRequest(**{**BASE.__dict__, "model": odd}))


# ----- the batched format: DeepEP low latency (rules vllm-moe-activation-format,
# vllm-batched-deepgemm) -----

DEEPEP_LL = (KIMI.replace("-tp 8 --max-num-batched-tokens 1024 ", "-dp 8 -ep ")
             + "--all2all-backend deepep_low_latency")


def test_deepep_low_latency_runs_batched_deep_gemm_masked():
    plan = from_command(DEEPEP_LL)
    assert experts(plan).kernel.name == "BatchedDeepGemmExperts"
    masked = [t for t in plan.tasks if t.kernel == "m_grouped_fp8_gemm_nt_masked"]
    # estimate_expected_m: 8 DP ranks x 256 tokens (the batched-DP budget) x top-8 / 384
    # experts = 42 -> 48, multiples of 16 from 16; the capacity 256 x 8 ranks without DP data.
    assert {t.m for t in masked} == {(16, 32, 48, 2048)}
    assert {(t.num_groups, t.n, t.k) for t in masked} == {(48, 4096, 7168), (48, 7168, 2048)}
    assert not [t for t in plan.tasks if t.kernel == "m_grouped_fp8_gemm_nt_contiguous"]
    assert not any("not modelled" in n and "all2all" in n for n in plan.engine_notes)


def test_deepep_low_latency_falls_back_to_batched_triton_and_checks_the_flag():
    plan = from_command(DEEPEP_LL, with_libs=("flashinfer", "nvcc"),
                        without_libs=("deep_gemm", "sgl_kernel"))
    sel = experts(plan)
    assert sel.kernel.name == "BatchedTritonExperts"
    assert "Triton batched MoE" in engine_jit(sel, plan.env, plan.mspec)[0]
    assert experts(from_command(DEEPEP_LL + " --moe-backend triton")).kernel.name == \
        "BatchedTritonExperts"
    with pytest.raises(WarmdInputError, match="no kernel for the batched MoE format"):
        from_command(DEEPEP_LL + " --moe-backend flashinfer_cutlass")
    # Without DP > 1 vLLM runs no all2all kernels: the standard format.
    standard = from_command(DEEPEP_LL.replace("-dp 8", "-tp 8"))
    assert experts(standard).kernel.name != "BatchedDeepGemmExperts"
