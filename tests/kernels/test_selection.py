"""Guarded kernel selection: capability AND library checks, reasons, wrappers, overrides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.plan_support import picked, rejections, selection
from warmd.examples import resolve_model_path
from warmd.kernels import preferences
from warmd.kernels.base import Branch, Environment, WrapperKernel
from warmd.kernels.registry import TritonFp8BlockScaledMMKernel
from warmd.kernels.selection import ALL_KERNELS, disabled_kernels_from_env, select_kernel
from warmd.libraries import display_name
from warmd.libraries.deep_gemm.kernels import DeepGemmFp8BlockScaledMMKernel
from warmd.libraries.flashinfer.kernels import FlashInferFp8BlockScaledMMKernel
from warmd.models import Layer, model_shapes
from warmd.mvalues import MSpec
from warmd.plan import build_plan, engine_jit, leaf_kernels
from warmd.probes import LibraryProbe
from warmd.targets import PRESETS


def libs(*present: str) -> dict[str, LibraryProbe]:
    names = ("deep_gemm", "flashinfer", "cutlass_dsl", "sgl_kernel", "nvcc")
    return {n: LibraryProbe(n, n in present, "1.0" if n in present else None,
                            reason="" if n in present else f"{n} not installed",
                            can_jit=n in present, display=display_name(n)) for n in names}


def env(target: str, *present: str, engine: str = "vllm", disabled=()) -> Environment:
    return Environment(PRESETS[target], libs(*present), engine, frozenset(disabled))


def plan_for(model: str, environment: Environment, tp: int = 1, ep: int = 1,
             quantization: str | None = None, mspec: MSpec | None = None):
    shapes = model_shapes(resolve_model_path(model), tp, ep, quantization)
    return build_plan(shapes, environment, mspec or MSpec("relax", 4096))


# Regression 1: a kernel chosen on capability alone crashes at the first forward.
def test_blackwell_mxfp8_without_flashinfer_falls_back_with_reason():
    plan = plan_for("llama-3.1-8b", env("b200", "deep_gemm", "nvcc"), quantization="mxfp8")
    for s in plan.selections:
        assert s.kernel is None or "FlashInfer" not in s.kernel.name
    # vLLM 0.34.0 _POSSIBLE_MXFP8_KERNELS: without FlashInfer, Marlin (compiled into vLLM).
    rejected = picked(plan, "self_attn.qkv_proj", "MarlinMxfp8LinearKernel")
    assert "FlashInfer unavailable" in rejected["FlashInferCutlassMxfp8LinearKernel"]
    assert "FlashInfer unavailable" in rejected["FlashInferCutedslMxfp8LinearKernel"]
    assert not [t for t in plan.tasks if t.library == "flashinfer"]
    sglang = plan_for("llama-3.1-8b", env("b200", "deep_gemm", "nvcc", engine="sglang"),
                      quantization="mxfp8")
    assert selection(sglang, "self_attn.qkv_proj").kernel.name == "EmulatedMxfp8LinearKernel"


def test_blackwell_mxfp8_with_flashinfer_selected_and_planned():
    # Without the CuTe DSL: FlashInfer CUTLASS, a module warmd builds.
    plan = plan_for("llama-3.1-8b", env("b200", "flashinfer", "nvcc"), quantization="mxfp8")
    reasons = picked(plan, "self_attn.qkv_proj", "FlashInferCutlassMxfp8LinearKernel")
    assert "cutlass_dsl" in reasons["FlashInferCutedslMxfp8LinearKernel"]
    modules = {t.module for t in plan.tasks if t.library == "flashinfer"}
    assert "mxfp8_gemm_cutlass" in modules
    # With it: the CuTe-DSL kernel first (rule vllm-mxfp8-order), compiled by the engine.
    plan = plan_for("llama-3.1-8b", env("b200", "flashinfer", "cutlass_dsl", "nvcc"),
                    quantization="mxfp8")
    qkv = selection(plan, "self_attn.qkv_proj")
    assert qkv.kernel.name == "FlashInferCutedslMxfp8LinearKernel"
    [line] = engine_jit(qkv, plan.env, plan.mspec)
    assert line.startswith("CuTe DSL MXFP8 GEMM") and "no executor here" in line


def test_capability_checked_even_with_library():
    # FlashInfer present but an Ampere target: the MXFP8 kernel needs sm100/sm120.
    plan = plan_for("llama-3.1-8b", env("a100", "flashinfer", "nvcc"), quantization="mxfp8")
    reasons = picked(plan, "self_attn.qkv_proj", "MarlinMxfp8LinearKernel")  # sm75+
    reason = reasons["FlashInferCutlassMxfp8LinearKernel"]
    assert "sm10x/sm12x" in reason and "sm_80" in reason


# Regression 2: a dynamic wrapper whose fallback is DeepGEMM must get DeepGEMM warmup.
def test_wrapper_with_deepgemm_fallback_gets_deepgemm_tasks():
    plan = plan_for("deepseek-v3", env("h200", "deep_gemm", "flashinfer", "nvcc"), tp=8)
    o_proj = selection(plan, "self_attn.o_proj")
    assert o_proj.kernel.name == "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    task = next(t for t in plan.tasks
                if t.kernel == "fp8_gemm_nt" and (t.n, t.k) == (7168, 2048))
    # vLLM >= 0.33.0's own warmup runs the DeepGEMM branch at every M (rule
    # vllm-wrapper-warmup), so that is what the engine's start compiles; before, only the
    # fallback's M (>= 32).
    assert task.m and min(task.m) == 1 and max(task.m) <= 4096
    assert "self_attn.o_proj" in task.layers
    assert any(t.module == "fp8_blockscale_gemm_90" for t in plan.tasks)  # the base branch
    older = plan_for("deepseek-v3", replace(env("h200", "deep_gemm", "flashinfer", "nvcc"),
                                            engine_version=(0, 32, 0)), tp=8)
    task = next(t for t in older.tasks
                if t.kernel == "fp8_gemm_nt" and (t.n, t.k) == (7168, 2048))
    assert min(task.m) >= 32


def test_wrapper_without_flashinfer_selects_plain_deepgemm_for_all_m():
    plan = plan_for("deepseek-v3", env("h200", "deep_gemm", "nvcc"), tp=8)
    o_proj = selection(plan, "self_attn.o_proj")
    assert o_proj.kernel.name == "DeepGemmFp8BlockScaledMMKernel"
    assert "FlashInfer" in o_proj.rejected[0].reason
    task = next(t for t in plan.tasks if (t.n, t.k) == (7168, 2048))
    assert min(task.m) == 1


def test_vllm_moe_with_e8m0_default_sends_every_m_to_deepgemm():
    plan = plan_for("qwen3-30b-a3b-fp8", env("h200", "deep_gemm", "nvcc"))
    w13 = selection(plan, "mlp.experts.w13")
    assert w13.kernel.name == "DeepGemmExperts"
    assert "VLLM_USE_DEEP_GEMM_E8M0" in w13.rejected[0].reason
    task = next(t for t in plan.tasks if t.kernel == "m_grouped_fp8_gemm_nt_contiguous"
                and (t.num_groups, t.n, t.k) == (128, 1536, 2048))
    # every 128-row multiple up to the worst case for 4096 tokens: 4096*8 + 128*127 -> 49024
    assert task.m[0] == 128 and task.m[-1] == 49024
    assert all(m % 128 == 0 for m in task.m)


def test_moe_wrapper_routes_large_m_to_deepgemm_grouped():
    environment = Environment(PRESETS["h200"], libs("deep_gemm", "nvcc"), "vllm",
                              deep_gemm_e8m0=False)
    plan = plan_for("qwen3-30b-a3b-fp8", environment, mspec=MSpec("full", 4096))
    w13 = selection(plan, "mlp.experts.w13")
    assert w13.kernel.name == "TritonOrDeepGemmExperts"
    task = next(t for t in plan.tasks if t.kernel == "m_grouped_fp8_gemm_nt_contiguous"
                and (t.num_groups, t.n, t.k) == (128, 1536, 2048))
    # The fallback starts at 128 tokens: 128 * top-8 + 128 experts * 127 rows = 17280.
    assert task.m == tuple(range(17280, 49024 + 1, 128))


def test_sglang_moe_uses_deepgemm_only_with_deepep():
    # python/sglang/srt/layers/moe/ep_moe/layer.py: DeepEPMoE only with --moe-a2a-backend
    # deepep; TP-only and a plain --ep run the Triton fused MoE.
    tp_only = plan_for("deepseek-v3", env("h200", "deep_gemm", "nvcc", engine="sglang"), tp=8)
    assert selection(tp_only, "mlp.experts.w13").kernel.name == "TritonExperts"
    assert "DeepEP" in selection(tp_only, "mlp.experts.w13").rejected[0].reason
    plain_ep = plan_for("deepseek-v3", env("h200", "deep_gemm", "nvcc", engine="sglang"), tp=8,
                        ep=8)
    assert selection(plain_ep, "mlp.experts.w13").kernel.name == "TritonExperts"
    assert not [t for t in plain_ep.tasks if t.num_groups]
    deepep_env = Environment(PRESETS["h200"], libs("deep_gemm", "nvcc"), "sglang",
                             moe_a2a_backend="deepep")
    deepep = plan_for("deepseek-v3", deepep_env, tp=8, ep=8)
    assert selection(deepep, "mlp.experts.w13").kernel.name == "DeepEPDeepGemmExperts"
    kernels = {t.kernel for t in deepep.tasks if t.num_groups == 32}
    assert kernels == {"m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"}


def test_deepgemm_rejects_unaligned_shapes(write_config):
    # hidden 2880 (64 mod 128): vLLM loads it (only sharded dims must be whole blocks) but
    # DeepGEMM cannot take K = 2880.
    config = {"model_type": "qwen3_moe", "hidden_size": 2880, "intermediate_size": 2880,
              "moe_intermediate_size": 2880, "num_experts": 32, "num_experts_per_tok": 4,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "num_hidden_layers": 2, "vocab_size": 201088,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    shapes = model_shapes(write_config(config), 1, 1)
    plan = build_plan(shapes, env("h200", "deep_gemm", "nvcc"), MSpec("relax", 1024))
    qkv = selection(plan, "self_attn.qkv_proj")
    assert qkv.kernel.name == "CutlassFp8BlockScaledMMKernel" or qkv.kernel.name.startswith(
        "Triton")
    reasons = rejections(qkv)
    assert "K=2880" in reasons["DeepGemmFp8BlockScaledMMKernel"]
    w2 = selection(plan, "mlp.experts.w2")
    assert w2.kernel.name == "TritonExperts"
    assert any("hidden=2880" in r.reason for r in w2.rejected)
    # o_proj (N=2880 is 64-aligned, K=4096) stays on DeepGEMM; nothing with K=2880 does.
    assert not [t for t in plan.tasks if t.library == "deep_gemm" and t.k == 2880]
    assert not [t for t in plan.tasks if t.num_groups]


def test_deepgemm_rejects_per_tensor_fp8():
    plan = plan_for("llama-3.1-8b", env("h200", "deep_gemm", "flashinfer", "nvcc"),
                    quantization="fp8_tensor")
    reasons = picked(plan, "self_attn.qkv_proj", "CutlassFP8ScaledMMLinearKernel")
    assert "per-tensor" in reasons["DeepGemmFp8BlockScaledMMKernel"] or \
        "fp8_tensor" in reasons["DeepGemmFp8BlockScaledMMKernel"]
    assert not [t for t in plan.tasks if t.library == "deep_gemm"]


def test_deepgemm_n_multiple_of_64_is_planned():
    # fused_qkv_a_proj has N=2112 (64-aligned, not 128): vLLM dispatches it to DeepGEMM.
    plan = plan_for("deepseek-v3", env("h200", "deep_gemm", "nvcc"), tp=8)
    assert any((t.n, t.k) == (2112, 7168) for t in plan.tasks)


def test_disabled_kernels_env_and_reason(monkeypatch):
    monkeypatch.setenv("WARMD_DISABLED_KERNELS", "DeepGemmFp8BlockScaledMMKernel")
    disabled = disabled_kernels_from_env()
    plan = plan_for("deepseek-v3", env("h200", "deep_gemm", "flashinfer", "nvcc",
                                       disabled=disabled), tp=8)
    reasons = picked(plan, "self_attn.o_proj", "CutlassFp8BlockScaledMMKernel")
    assert "disabled" in reasons["FlashInferFp8DeepGEMMDynamicBlockScaledKernel"]
    assert "disabled" in reasons["DeepGemmFp8BlockScaledMMKernel"]
    assert not [t for t in plan.tasks if t.kernel == "fp8_gemm_nt"]


class _InnerWrapper(WrapperKernel):
    name = "TestInnerWrapper"
    op = "linear"
    branches = (Branch("base", FlashInferFp8BlockScaledMMKernel, 1, 15),
                Branch("fallback", DeepGemmFp8BlockScaledMMKernel, 16, None))


class _OuterWrapper(WrapperKernel):
    name = "TestOuterWrapper"
    op = "linear"
    branches = (Branch("base", _InnerWrapper, 1, 63),
                Branch("fallback", TritonFp8BlockScaledMMKernel, 64, None))


def test_nested_wrappers_follow_every_branch(monkeypatch):
    monkeypatch.setitem(ALL_KERNELS, _OuterWrapper.name, _OuterWrapper)
    table = {**preferences.PREFERENCES["vllm"]["hopper"], "linear.fp8": [_OuterWrapper.name]}
    monkeypatch.setitem(preferences.PREFERENCES["vllm"], "hopper", table)
    leaves = [(k.name, r) for k, r in leaf_kernels(_OuterWrapper)]
    assert leaves == [("FlashInferFp8BlockScaledMMKernel", (1, 15)),
                      ("DeepGemmFp8BlockScaledMMKernel", (16, 63)),
                      ("TritonFp8BlockScaledMMKernel", (64, None))]
    # vLLM 0.32.0: before its warmup ran a wrapper's DeepGEMM branch at every M.
    older = replace(env("h200", "deep_gemm", "flashinfer", "nvcc"), engine_version=(0, 32, 0))
    plan = plan_for("llama-3.1-8b", older, quantization="fp8_block", mspec=MSpec("full", 128))
    gemm = [t for t in plan.tasks if t.kernel == "fp8_gemm_nt"]
    assert gemm and all(t.m == tuple(range(16, 64)) for t in gemm)


def test_nested_wrapper_rejected_when_inner_branch_unsupported():
    reason = _OuterWrapper.is_supported(env("h200", "deep_gemm", "nvcc"))[1]
    assert "TestInnerWrapper" in reason and "FlashInfer" in reason


def test_selection_without_any_candidate_is_explicit():
    layer = Layer("x", "linear", "fp8_block", 4096, 4096, block=(128, 128))
    result = select_kernel(layer, env("a100"))
    assert result.kernel.name == "TritonFp8BlockScaledMMKernel"
    layer = Layer("y", "linear", "fp8_tensor", 4096, 4096)
    result = select_kernel(layer, env("a100"))  # sm80 has no FP8 tensor cores
    assert result.kernel is None
    reasons = rejections(result)
    assert ">= 8.9; target is 8.0" in reasons["CutlassFP8ScaledMMLinearKernel"]
    assert "fp8_tensor" in reasons["TritonFp8BlockScaledMMKernel"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("target", sorted(PRESETS))
def test_every_preference_names_a_registered_kernel(engine, target):
    table = preferences.PREFERENCES[engine][preferences.platform_of(PRESETS[target].capability)]
    for names in table.values():
        assert set(names) <= set(ALL_KERNELS)


def test_sglang_prefers_flashinfer_activation_without_sgl_kernel():
    plan = plan_for("qwen3-30b-a3b-fp8", env("h200", "flashinfer", "nvcc", engine="sglang"))
    act = selection(plan, "mlp.act_fn")
    assert act.kernel.name == "FlashInferActivation"
    assert "sgl-kernel unavailable" in act.rejected[0].reason
    assert any(t.module == "silu_and_mul" for t in plan.tasks)


def test_vllm_disabled_kernels_of_the_engine_environment(monkeypatch):
    from warmd.plan import PlanRequest, make_plan

    request = PlanRequest(model="deepseek-v3", tp=8, target="h200",
                          with_libs=("deep_gemm", "flashinfer", "nvcc"))
    # vLLM checks the variable against the class it selects only (rule
    # vllm-disabled-kernels): naming the wrapper's DeepGEMM branch leaves the wrapper, and
    # its DeepGEMM branch, running.
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "DeepGemmFp8BlockScaledMMKernel")
    o_proj = selection(make_plan(request), "self_attn.o_proj")
    assert o_proj.kernel.name == "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "FlashInferFp8DeepGEMMDynamicBlockScaledKernel,"
                                                "DeepGemmFp8BlockScaledMMKernel")
    plan = make_plan(request)
    reasons = picked(plan, "self_attn.o_proj", "CutlassFp8BlockScaledMMKernel")
    assert "VLLM_DISABLED_KERNELS" in reasons["DeepGemmFp8BlockScaledMMKernel"]
    assert not [t for t in plan.tasks if t.kernel == "fp8_gemm_nt"]
    # warmd's own --disable-kernel naming a branch rejects the wrapper.
    monkeypatch.delenv("VLLM_DISABLED_KERNELS")
    own = make_plan(replace(request, disabled_kernels=("DeepGemmFp8BlockScaledMMKernel",)))
    assert selection(own, "self_attn.o_proj").kernel.name == "CutlassFp8BlockScaledMMKernel"
