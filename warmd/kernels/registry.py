"""The engines' own kernels, per op family: built into the engine (nothing to JIT) or needing
only a helper library (sgl-kernel). The JIT libraries' kernels live in their packages
(warmd/libraries/<name>/kernels.py); ``warmd.kernels.selection.ALL_KERNELS`` joins them.
Names follow the engines' own kernel classes so that VLLM_DISABLED_KERNELS-style lists apply
unchanged."""

from __future__ import annotations

from warmd.kernels.base import OK, Check, Environment, Kernel
from warmd.models import Layer

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


class UnquantizedLinearKernel(Kernel):
    name = "UnquantizedLinearKernel"
    op = "linear"
    schemes = ("bf16",)


# ----- Fused MoE -----

class TritonExperts(Kernel):
    name = "TritonExperts"
    op = "moe"
    schemes = ("fp8_block", "fp8_tensor", "bf16")
    min_capability = (8, 0)


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
    UnquantizedLinearKernel,
    TritonExperts,
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
