"""The rules issue 27's audit found wrong, each read against vLLM 0.34.0 / SGLang 0.5.23 and
held by a row of warmd/engines/rules.py: what the engine as launched runs, and what it
JIT-compiles that the plan must name."""

from __future__ import annotations

import json

import pytest

from tests.plan_support import MODELS, from_command, rejections, selection
from warmd.engines.triton_moe import moe_configs
from warmd.errors import WarmdInputError
from warmd.plan import engine_jit

LIBS = ("deep_gemm", "flashinfer", "nvcc", "cutlass_dsl")


def jit(plan, layer: str) -> list[str]:
    return engine_jit(selection(plan, layer), plan.env, plan.mspec)


@pytest.mark.parametrize("name, tp", [("qwen3_235b_a22b_fp8", 8), ("qwen3_30b_a3b_fp8", 4)])
def test_vllm_refines_fp8_moe_blocks_a_tp_shard_does_not_fit(name, tp):
    # oracle/fp8.py refine_fp8_moe_block_shape: 192 per rank, gcd(128, 128, 192, hidden) = 64.
    plan = from_command(f"vllm serve {{{name}}} -tp {tp}", with_libs=LIBS)
    w13 = selection(plan, "mlp.experts.w13")
    assert w13.kernel.name == "TritonExperts" and w13.layer.block == (64, 64)
    rejected = rejections(w13)
    assert "128x128" in rejected.get("DeepGemmExperts", rejected.get(
        "TritonOrDeepGemmExperts", "128x128"))
    [line] = jit(plan, "mlp.experts.w13")
    assert "block_shape=[64,64]: get_default_config" in line
    assert any("vLLM refines the scales to 64x64" in n for n in plan.engine_notes)
    # SGLang has no refinement; vLLM before 0.33.0 was not read: refused as before.
    with pytest.raises(WarmdInputError, match="refuses to load this checkpoint"):
        from_command(f"python -m sglang.launch_server --model-path {{{name}}} --tp {tp}")
    with pytest.raises(WarmdInputError, match="refuses to load this checkpoint"):
        from_command(f"vllm serve {{{name}}} -tp {tp}", engine_version="0.32.0")


def test_a_shard_the_blocks_fit_is_not_refined():
    plan = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2", with_libs=LIBS)
    assert selection(plan, "mlp.experts.w13").layer.block == (128, 128)
    assert not any("refines" in n for n in plan.engine_notes)


def test_cutlass_block_fp8_has_no_n_condition_in_vllm_but_has_in_sglang():
    # scaled_mm/cutlass.py CutlassFp8BlockScaledMMKernel.can_implement: no shape check;
    # DeepSeek-V3's fused_qkv_a_proj has N = 1536 + 512 + 64 = 2112.
    plan = from_command("vllm serve {kimi_k2_instruct} -tp 8", with_libs=LIBS,
                        engine_env=(("VLLM_USE_DEEP_GEMM", "0"),))
    qkv_a = selection(plan, "self_attn.fused_qkv_a_proj")
    assert qkv_a.layer.n == 2112 and qkv_a.kernel.name == "CutlassFp8BlockScaledMMKernel"
    sglang = from_command("python -m sglang.launch_server --model-path {kimi_k2_instruct} "
                          "--tp 8 --fp8-gemm-backend cutlass", with_libs=LIBS)
    reasons = rejections(selection(sglang, "self_attn.fused_qkv_a_proj"))
    assert "needs N and K % 128; layer has N=2112" in reasons["CutlassFp8BlockScaledMMKernel"]


def test_triton_block_fp8_linear_is_named_as_left_to_the_engine():
    plan = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2 --linear-backend triton",
                        with_libs=LIBS)
    assert selection(plan, "self_attn.qkv_proj").kernel.name == "TritonFp8BlockScaledMMKernel"
    [line] = jit(plan, "self_attn.qkv_proj")
    assert line.startswith("Triton block-FP8 GEMM (w8a8_triton_block_scaled_mm")


def test_the_down_tables_tma_configs_are_named():
    # experts/triton_moe.py TritonExperts.apply: E=256,N=256 H200 has a _down table whose
    # 1024 and 3072 configs set USE_TMA.
    configs = moe_configs(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128), 1, 8192)
    assert configs.tuned and configs.tma_down == (1024, 3072)
    assert "_down, on sm90 with DeepGEMM E8M0 scales" in configs.describe()
    small = moe_configs(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128), 1, 256)
    assert small.tma_down == ()
    assert moe_configs(128, 384, "NVIDIA H200", "fp8_w8a8", (128, 128), 1, 8192).tma_down == ()


def test_a_deepseek_v3_plan_names_the_tma_down_configs(tmp_path):
    config = json.loads((MODELS / "kimi-k2-instruct" / "config.json").read_text())
    config["n_routed_experts"] = 256  # DeepSeek-V3: 256 experts, 2048 / TP 8 = 256
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = from_command(f"vllm serve {tmp_path} -tp 8", with_libs=LIBS)
    [line] = jit(plan, "mlp.experts.w13")
    assert "E=256,N=256,device_name=NVIDIA_H200" in line and "TMA down-GEMM configs" in line


def test_sglang_plans_name_sglangs_own_triton_moe_tables():
    # fused_moe_triton_config.py get_moe_configs: configs/triton_<version>/, the newest
    # directory with the table when the node's Triton has none; "[128, 128]" as Python
    # prints it.
    plan = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                        "--tp 2", with_libs=LIBS)
    [line] = jit(plan, "mlp.experts.w13")
    assert "(SGLang's tables)" in line
    assert "tuned table E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8," \
           "block_shape=[128, 128]" in line
    own = moe_configs(128, 192, "NVIDIA H200", "fp8_w8a8", None, 1, 4096, "sglang", "3.4.0")
    assert own.tuned
    # ... and vLLM plans keep vLLM's tables
    vllm = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2", with_libs=LIBS)
    assert jit(vllm, "mlp.experts.w13")[0].startswith("Triton fused MoE: ")


def test_fa4_mla_prefill_is_named_on_blackwell():
    # platforms/interface.py get_mla_prefill_backend_cls: FLASH_ATTN (FA4) first on sm100.
    plan = from_command("vllm serve {kimi_k2_instruct} -tp 8", target="b200", with_libs=LIBS)
    lines = jit(plan, "self_attn.attn")
    assert any("FA4 CuTe-DSL MLA prefill" in line for line in lines)
    hopper = from_command("vllm serve {kimi_k2_instruct} -tp 8", with_libs=LIBS)
    assert not any("FA4" in line for line in jit(hopper, "self_attn.attn"))
