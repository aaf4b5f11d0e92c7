"""The engines' own kernels, per op family: built into the engine (nothing to JIT) or needing
only a helper library (sgl-kernel). The JIT libraries' kernels live in their packages
(warmd/libraries/<name>/kernels.py); ``warmd.kernels.selection.ALL_KERNELS`` joins them.
Names follow the engines' own kernel classes so that VLLM_DISABLED_KERNELS-style lists apply
unchanged."""

from __future__ import annotations

from warmd.kernels.base import OK, Check, Environment, Kernel
from warmd.models import Layer
from warmd.mvalues import MSpec

# ----- FP8 linear (block-scaled and per-tensor) -----

class CutlassFp8BlockScaledMMKernel(Kernel):
    name = "CutlassFp8BlockScaledMMKernel"
    op = "linear"
    capabilities = (9, 10)
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        """vLLM (rule vllm-cutlass-block-fp8): dynamic per-token-group activations only, no
        shape condition (the kernel pads N). SGLang's cutlass_w8a8_block_fp8_linear_with_
        fallback runs Triton unless N and K are multiples of 128."""
        if layer.quant != "fp8_block":
            return False, f"needs FP8 block-scaled weights; layer is {layer.quant}"
        if env.engine == "sglang" and (layer.n % 128 or layer.k % 128):
            return False, (f"SGLang's CUTLASS block FP8 needs N and K % 128; "
                           f"layer has N={layer.n}, K={layer.k}")
        return OK


class TritonFp8BlockScaledMMKernel(Kernel):
    name = "TritonFp8BlockScaledMMKernel"
    op = "linear"
    schemes = ("fp8_block",)
    min_capability = (8, 0)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        """w8a8_triton_block_scaled_mm: Triton compiles a kernel per config of the tuned
        N,K table (or its default config) at the first call of each (rules
        vllm-triton-block-fp8-linear, sglang-fp8-gemm-backend)."""
        block = layer.block or (128, 128)
        return (f"Triton block-FP8 GEMM (w8a8_triton_block_scaled_mm, N={layer.n}, "
                f"K={layer.k}, block [{block[0]}, {block[1]}]): a kernel per config of its "
                "tuned N,K table, compiled by the engine at first use; no executor here")


class CutlassFP8ScaledMMLinearKernel(Kernel):
    name = "CutlassFP8ScaledMMLinearKernel"
    op = "linear"
    min_capability = (8, 9)
    schemes = ("fp8_tensor",)


class TorchFP8ScaledMMLinearKernel(Kernel):
    name = "TorchFP8ScaledMMLinearKernel"
    op = "linear"
    min_capability = (8, 9)
    schemes = ("fp8_tensor",)


# ----- MXFP8 and BF16 linear -----

class EmulatedMxfp8LinearKernel(Kernel):
    """Dequantizes MXFP8 weights to BF16 and runs a cuBLAS GEMM: slow but always there."""

    name = "EmulatedMxfp8LinearKernel"
    op = "linear"
    schemes = ("mxfp8",)


class MarlinMxfp8LinearKernel(Kernel):
    """vLLM's Marlin MXFP8 (weight-only, compiled into vLLM): sm75 and later, K % 32
    (kernels/linear/mxfp8/marlin.py); what vLLM 0.34.0 runs without FlashInfer."""

    name = "MarlinMxfp8LinearKernel"
    op = "linear"
    schemes = ("mxfp8",)
    min_capability = (7, 5)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        ok, reason = super().can_implement(layer, env)
        if ok and layer.k % 32:
            return False, f"Marlin MXFP8 needs K % 32; layer has K={layer.k}"
        return ok, reason


class UnquantizedLinearKernel(Kernel):
    name = "UnquantizedLinearKernel"
    op = "linear"
    schemes = ("bf16",)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        """vLLM's kernel_warmup compiles the CuTe-DSL ll_bf16 router GEMM for every bf16
        MoE gate (K % 8) at M 1..16 on sm90 and later (rule vllm-ll-bf16-router-warmup),
        whatever the router computes in; GateLinear adds the ll_fp32w kernels for an FP32
        router (rule vllm-cutedsl-router-gemm)."""
        from warmd.engines.rules import BY_ID

        rule = BY_ID["vllm-ll-bf16-router-warmup"]
        if layer.name != "mlp.gate" or env.engine != "vllm" or layer.k % 8 or \
                env.target.capability < (9, 0) or \
                not env.library("cutlass_dsl").available or \
                not rule.versions.contains(env.engine_version):
            return None
        return (f"CuTe-DSL router GEMM (ll_bf16, K={layer.k}, N={layer.n}, M 1..16; "
                "ll_fp32w too if the router computes in FP32): compiled by the engine's "
                "kernel_warmup; no executor here")


# ----- Fused MoE -----

class TritonExperts(Kernel):
    """Triton fused MoE (vLLM's default FP8 MoE on Hopper under TP since 0.17): Triton compiles
    one kernel per config of the layer's tuned table at the engine's start, and again at batch
    sizes first seen in traffic (warmd.engines.triton_moe)."""

    name = "TritonExperts"
    op = "moe"
    schemes = ("fp8_block", "fp8_tensor", "bf16")
    min_capability = (8, 0)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        from warmd.engines.triton_moe import moe_configs

        tokens = mspec.moe_tokens or mspec.max_tokens
        lo, hi = m_range[0], tokens if m_range[1] is None else min(m_range[1], tokens)
        if hi < lo:
            return None
        if env.batch_invariant:
            return ("Triton fused MoE: 1 config (VLLM_BATCH_INVARIANT: get_default_config's "
                    "batch-invariant config, no tuned table); no executor here")
        dtype = "fp8_w8a8" if layer.quant in ("fp8_block", "fp8_tensor") else None
        block = layer.block if layer.quant == "fp8_block" else None
        triton = env.library("triton")
        configs = moe_configs(layer.num_groups or 1, layer.param.get("intermediate", layer.k),
                              env.target.name, dtype, block, lo, hi, env.engine,
                              triton.version if triton.available else None)
        owner = " (SGLang's tables)" if env.engine == "sglang" else ""
        return f"Triton fused MoE{owner}: {configs.describe()}; no executor here"


class BatchedTritonExperts(Kernel):
    """vLLM's BATCHED_TRITON (fused_moe/experts/fused_batched_moe.py): the batched-format
    Triton MoE of the DeepEP low-latency / NIXL EP all2all, where DeepGEMM cannot run."""

    name = "BatchedTritonExperts"
    op = "moe"
    schemes = ("fp8_block", "fp8_tensor", "bf16")
    min_capability = (8, 0)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        return ("Triton batched MoE (BatchedTritonExperts): compiled at the engine's start "
                "and in traffic; no executor here")


class CutlassBlockScaledGroupedGemmExperts(Kernel):
    """vLLM before 0.14.0 on sm100: CUTLASS block-scaled grouped GEMM for block FP8 MoE
    (quantization/fp8.py); compiled into vLLM."""

    name = "CutlassBlockScaledGroupedGemmExperts"
    op = "moe"
    capabilities = (10,)
    schemes = ("fp8_block",)


# ----- Attention -----

class AttentionKernel(Kernel):
    """An attention backend for one kind of attention layer (MHA/GQA or MLA)."""

    op = "attention"
    kind: str = "mha"

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        if layer.param.get("kind") != cls.kind:
            return False, f"implements {cls.kind.upper()}; layer is {layer.param.get('kind')}"
        return OK


class FlashAttentionBackend(AttentionKernel):
    name = "FlashAttentionBackend"
    capabilities = (8, 9)


class TritonAttentionBackend(FlashAttentionBackend):
    name = "TritonAttentionBackend"
    capabilities = ()


class FlashMLABackend(AttentionKernel):
    name = "FlashMLABackend"
    kind = "mla"
    capabilities = (9, 10)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        return mla_prefill_jit(layer, env)


def mla_prefill_jit(layer: Layer, env: Environment) -> str | None:
    """vLLM's MLA prefill on sm100 whatever the decode backend: FA4 (CuTe DSL, compiled by
    its JIT warmup) first (rule vllm-fa4-mla-prefill; TRT-LLM ragged first only for
    qk_nope 192 / v 256 heads, which warmd's layer does not carry: named as the exception)."""
    from warmd.engines.rules import BY_ID

    if env.engine != "vllm" or env.target.capability[0] != 10 or \
            not BY_ID["vllm-fa4-mla-prefill"].versions.contains(env.engine_version):
        return None
    return (f"FA4 CuTe-DSL MLA prefill (flash_attn.cute, {layer.param.get('num_heads')} heads; "
            "TRT-LLM ragged instead for qk_nope 192 / v 256 heads): compiled by vLLM's JIT "
            "warmup; no executor here")


class FlashAttnMLABackend(FlashMLABackend):
    """vLLM's FLASH_ATTN_MLA: FlashAttention 3 MLA, Hopper only, compiled into vLLM."""

    name = "FlashAttnMLABackend"
    capabilities = (9,)


class CutlassMLABackend(FlashMLABackend):
    name = "CutlassMLABackend"
    capabilities = (10,)


class TritonMLABackend(FlashMLABackend):
    name = "TritonMLABackend"
    capabilities = ()


class TrtllmMLABackend(FlashMLABackend):
    """SGLang's trtllm_mla (layers/attention/trtllm_mla_backend.py): FlashInfer's TRT-LLM-gen
    MLA kernels for decode and prefill, cubins FlashInfer loads (no batch_mla module);
    SM100/SM12x only (arg_groups/overrides.py refuses it elsewhere). SGLang's default for
    the DeepSeek-V3 family on sm100 (rule sglang-deepseek-trtllm-mla)."""

    name = "TrtllmMLABackend"
    library = "flashinfer"
    capabilities = (10, 12)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        return ("FlashInfer TRT-LLM-gen MLA (trtllm_batch_decode_with_kv_cache_mla, "
                "trtllm_ragged_attention_deepseek): kernels FlashInfer loads at the engine's "
                "start; no executor here")


# ----- Activation and sampling -----

class SglKernelActivation(Kernel):
    name = "SglKernelActivation"
    op = "activation"
    library = "sgl_kernel"


class VllmCustomOpActivation(Kernel):
    """vLLM's compiled _C activation ops: shipped with the engine, nothing to JIT."""

    name = "VllmCustomOpActivation"
    op = "activation"


class TorchActivation(Kernel):
    name = "TorchActivation"
    op = "activation"


class TorchSampler(Kernel):
    name = "TorchSampler"
    op = "sampling"


ENGINE_KERNELS: tuple[type[Kernel], ...] = (
    CutlassFp8BlockScaledMMKernel,
    TritonFp8BlockScaledMMKernel,
    CutlassFP8ScaledMMLinearKernel,
    TorchFP8ScaledMMLinearKernel,
    EmulatedMxfp8LinearKernel,
    MarlinMxfp8LinearKernel,
    UnquantizedLinearKernel,
    TritonExperts,
    BatchedTritonExperts,
    CutlassBlockScaledGroupedGemmExperts,
    FlashAttentionBackend,
    TritonAttentionBackend,
    FlashMLABackend,
    FlashAttnMLABackend,
    CutlassMLABackend,
    TritonMLABackend,
    TrtllmMLABackend,
    SglKernelActivation,
    VllmCustomOpActivation,
    TorchActivation,
    TorchSampler,
)
