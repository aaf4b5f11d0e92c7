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
        if layer.quant != "fp8_block":
            return False, f"needs FP8 block-scaled weights; layer is {layer.quant}"
        if layer.n % 128 or layer.k % 128:
            return False, (f"CUTLASS block FP8 needs N and K % 128; "
                           f"layer has N={layer.n}, K={layer.k}")
        return OK


class TritonFp8BlockScaledMMKernel(Kernel):
    name = "TritonFp8BlockScaledMMKernel"
    op = "linear"
    schemes = ("fp8_block",)
    min_capability = (8, 0)


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
        """vLLM 0.34.0's MoE router (GateLinear, rule vllm-cutedsl-router-gemm): CuTe-DSL
        GEMMs when the router computes in FP32, which warmd does not follow per model."""
        from warmd.engines.rules import BY_ID

        rule = BY_ID["vllm-cutedsl-router-gemm"]
        if layer.name != "mlp.gate" or env.engine != "vllm" or \
                env.target.capability[0] not in (9, 10) or \
                not env.library("cutlass_dsl").available or \
                not rule.versions.contains(env.engine_version):
            return None
        return ("CuTe-DSL router GEMM (ll_bf16/ll_fp32w, M <= 4 dot product, split-K above) "
                "if the router computes in FP32: compiled at the engine's start; no executor "
                "here")


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
        configs = moe_configs(layer.num_groups or 1, layer.param.get("intermediate", layer.k),
                              env.target.name, dtype, block, lo, hi)
        return f"Triton fused MoE: {configs.describe()}; no executor here"


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
    SglKernelActivation,
    VllmCustomOpActivation,
    TorchActivation,
    TorchSampler,
)
