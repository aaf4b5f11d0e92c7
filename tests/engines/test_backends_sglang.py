"""SGLang's backends as it chooses them: its attention backend per GPU and model family
(get_default_attn_backend, the DeepSeek-family overrides) and its --moe-runner-backend.
Published configs live in tests/data/models."""

from __future__ import annotations

import json

import pytest

from tests.plan_support import MODELS, experts, from_command, modules, selection
from warmd.errors import WarmdInputError

SGLANG_KIMI = "python -m sglang.launch_server --model-path {kimi_k2_instruct} --tp 8 "


@pytest.mark.parametrize("flags, target, kernel", [
    # get_default_attn_backend (arg_groups/model_override_base.py, 0.5.23): MLA runs fa3 on
    # Hopper and flashinfer on sm100.
    ("", "h200", "FlashAttnMLABackend"),
    # ... but SGLang sets trtllm_mla itself for the DeepSeek-V3 family on sm100
    # (model_overrides/deepseek_v2.py _deepseek_family_overrides): no batch_mla module.
    ("", "b200", "TrtllmMLABackend"),
    ("--attention-backend flashinfer", "b200", "FlashInferMLABackend"),
    ("--attention-backend flashinfer", "h200", "FlashInferMLABackend"),
    ("--attention-backend triton", "h200", "TritonMLABackend"),
    ("--attention-backend trtllm_mla", "b200", "TrtllmMLABackend"),
])
def test_sglang_attention_backend(flags, target, kernel):
    plan = from_command(SGLANG_KIMI + flags, target=target)
    assert selection(plan, "self_attn.attn").kernel.name == kernel
    has_mla_module = any(m.startswith("batch_mla_attention") for m in modules(plan))
    assert has_mla_module == (kernel == "FlashInferMLABackend")


def test_sglang_trtllm_mla_is_refused_off_blackwell_as_sglang_refuses_it():
    # arg_groups/overrides.py: "TRTLLM MLA backend is only supported on Blackwell GPUs".
    with pytest.raises(WarmdInputError, match="--attention-backend trtllm_mla cannot run "
                                              "self_attn.attn here.*TrtllmMLABackend: "):
        from_command(SGLANG_KIMI + "--attention-backend trtllm_mla", target="h200")


def test_sglang_deepseek_default_is_only_for_its_architectures(tmp_path):
    # A DeepSeek-V2 checkpoint is not in _deepseek_family_overrides' registration.
    config = json.loads((MODELS / "kimi-k2-instruct" / "config.json").read_text())
    config["architectures"] = ["DeepseekV2ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = from_command(SGLANG_KIMI.replace("{kimi_k2_instruct}", str(tmp_path)),
                        target="b200")
    assert selection(plan, "self_attn.attn").kernel.name == "FlashInferMLABackend"


def test_sglang_auto_runner_on_blackwell_deepseek_is_flashinfer_trtllm():
    plan = from_command(SGLANG_KIMI, target="b200")
    assert experts(plan).kernel.name == "TrtLlmFp8Experts"
    assert "fused_moe_trtllm_sm100" in modules(plan)
    assert any("flashinfer_trtllm" in n for n in plan.engine_notes)
    deepep = from_command(SGLANG_KIMI + "--moe-a2a-backend deepep", target="b200")
    assert experts(deepep).kernel.name == "DeepEPDeepGemmExperts"
    qwen = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                        "--tp 2", target="b200")
    assert experts(qwen).kernel.name == "TritonExperts"  # not DeepSeek-family: auto stays


def test_sglang_moe_runner_backend():
    deepep = ("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} --tp 4 "
              "--moe-a2a-backend deepep")
    assert experts(from_command(deepep)).kernel.name == "DeepEPDeepGemmExperts"
    triton = from_command(deepep + " --moe-runner-backend triton")
    assert experts(triton).kernel.name == "TritonExperts"
    assert not [t for t in triton.tasks if t.num_groups]
    # Fp8MoEMethod.create_moe_runner: flashinfer_cutlass / flashinfer_cutedsl have no FP8
    # MoE path; SGLang runs Triton (no fused_moe_90 module), on B200 too.
    for runner in ("flashinfer_cutlass", "flashinfer_cutedsl"):
        for target in ("h200", "b200"):
            plan = from_command(deepep + f" --moe-runner-backend {runner}", target=target)
            assert experts(plan).kernel.name == "TritonExperts"
            assert not [m for m in modules(plan) if m.startswith("fused_moe")]
            assert any("has no FP8 MoE path" in n for n in plan.engine_notes)


def test_sglang_deep_gemm_runner_without_deepep_runs_the_standard_dispatcher():
    # moe_runner/deep_gemm.py pre_permute_standard_to_deep_gemm: no refusal, DeepGEMM's
    # contiguous and masked grouped GEMMs.
    command = ("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} --tp 2 "
               "--moe-runner-backend deep_gemm")
    plan = from_command(command)
    assert experts(plan).kernel.name == "DeepGemmRunnerExperts"
    assert {t.kernel for t in plan.tasks if t.num_groups} == \
        {"m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"}
    assert any("through the standard dispatcher" in n for n in plan.engine_notes)
    with_deepep = from_command(command.replace("--tp 2", "--tp 2 --moe-a2a-backend deepep"))
    assert experts(with_deepep).kernel.name == "DeepEPDeepGemmExperts"
