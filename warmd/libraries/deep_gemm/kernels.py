"""DeepGEMM's kernels as the engines dispatch to them, with the GEMM configs each needs."""

from __future__ import annotations

from warmd.kernels.base import (
    OK,
    Branch,
    Check,
    Environment,
    JitWork,
    Kernel,
    MRange,
    WrapperKernel,
    fp8_block_128,
)
from warmd.kernels.registry import TritonExperts
from warmd.models import Layer
from warmd.mvalues import MSpec, clip, grouped_m_values

# DeepGEMM's shape rules as vLLM applies them before dispatching (should_use_deepgemm_for_
# fp8_linear: N % 64, K % 128; grouped contiguous layout: N and K % 128).
DEEPGEMM_LINEAR_N_MULTIPLE = 64
DEEPGEMM_K_MULTIPLE = 128
DEEPGEMM_GROUPED_MULTIPLE = 128


def deep_gemm_scale_format(env: Environment) -> str:
    """DeepGEMM's scale-factor format, part of its kernel config: packed UE8M0 on the
    Blackwell families (sm100, sm120), FP32 scales on sm90."""
    return "ue8m0" if env.target.capability[0] in (10, 12) else "float32"


# vLLM 0.34.0 runs DeepGEMM on sm90, the sm100 family and the sm120 family (rule
# vllm-deepgemm-sm120: platforms/cuda.py CudaPlatformBase.support_deep_gemm).
DEEP_GEMM_CAPABILITIES = (9, 10, 12)


def _deep_gemm_spec(env: Environment) -> tuple[tuple[str, object], ...]:
    return (("scale_fmt", deep_gemm_scale_format(env)),)


class DeepGemmFp8BlockScaledMMKernel(Kernel):
    name = "DeepGemmFp8BlockScaledMMKernel"
    op = "linear"
    library = "deep_gemm"
    capabilities = DEEP_GEMM_CAPABILITIES
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        ok, reason = fp8_block_128(layer)
        if not ok:
            return ok, reason
        if layer.n % DEEPGEMM_LINEAR_N_MULTIPLE or layer.k % DEEPGEMM_K_MULTIPLE:
            return False, (f"DeepGEMM needs N % {DEEPGEMM_LINEAR_N_MULTIPLE} == 0 and "
                           f"K % {DEEPGEMM_K_MULTIPLE} == 0; layer has N={layer.n}, K={layer.k}")
        return OK

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        m = clip(mspec.values(layer.n, env.target.sms), *_warmed_range(env, m_range))
        if not m:
            return []
        return [JitWork("deep_gemm", "fp8_gemm_nt", layer.n, layer.k, None, tuple(m),
                        spec=_deep_gemm_spec(env))]


def _warmed_range(env: Environment, m_range: MRange) -> MRange:
    """The M range the engine compiles DeepGEMM for. vLLM's own warmup (rule
    vllm-wrapper-warmup: deep_gemm_warmup.py _deep_gemm_linear_data) runs the DeepGEMM
    branch of the FlashInfer/DeepGEMM wrapper at every M of its set, M < 32 included, though
    traffic sends those to FlashInfer: warmd warms what the engine's start compiles."""
    from warmd.engines.rules import BY_ID

    rule = BY_ID["vllm-wrapper-warmup"]
    if env.engine == "vllm" and m_range != (1, None) and \
            rule.versions.contains(env.engine_version):
        return 1, None
    return m_range


def _experts_aligned(layer: Layer) -> Check:
    ok, reason = fp8_block_128(layer)
    if not ok:
        return ok, reason
    # vLLM decides for the whole MoE layer (w13 and w2 together) from hidden and intermediate.
    hidden, inter = layer.param["hidden"], layer.param["intermediate"]
    if hidden % DEEPGEMM_GROUPED_MULTIPLE or inter % DEEPGEMM_GROUPED_MULTIPLE:
        return False, (f"DeepGEMM grouped GEMM needs hidden and per-rank intermediate sizes "
                       f"% {DEEPGEMM_GROUPED_MULTIPLE}; layer has hidden={hidden}, "
                       f"intermediate={inter}")
    return OK


def _contiguous_work(layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
    rows = grouped_m_values(mspec, layer.n, env.target.sms, layer.topk or 1,
                            layer.num_groups, *m_range)
    if not rows:
        return []
    return [JitWork("deep_gemm", "m_grouped_fp8_gemm_nt_contiguous", layer.n, layer.k,
                    layer.num_groups, tuple(rows), spec=_deep_gemm_spec(env))]


class DeepGemmExperts(Kernel):
    """DeepGEMM's contiguous-layout grouped GEMM for every M (vLLM with E8M0 scales on, its
    default, sends every M here)."""

    name = "DeepGemmExperts"
    op = "moe"
    library = "deep_gemm"
    capabilities = DEEP_GEMM_CAPABILITIES
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return _experts_aligned(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return _contiguous_work(layer, env, mspec, m_range)


class DeepEPDeepGemmExperts(DeepGemmExperts):
    """SGLang with DeepEP (expert parallel): the contiguous grouped GEMM for prefill (normal
    mode) and the masked grouped GEMM for decode (low-latency mode)."""

    name = "DeepEPDeepGemmExperts"

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        # python/sglang/srt/layers/moe/ep_moe/layer.py: DeepEPMoE only for the deepep a2a
        # backend; a plain --ep runs the Triton fused MoE. Checked first: without DeepEP,
        # whether DeepGEMM is installed is beside the point.
        if env.moe_a2a_backend != "deepep":
            return False, ("SGLang runs DeepGEMM MoE only with DeepEP "
                           "(--moe-a2a-backend deepep)")
        return super().is_supported(env)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return _experts_aligned(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        work = _contiguous_work(layer, env, mspec, m_range)
        expected = clip(mspec.values(layer.n, env.target.sms), *m_range)
        if expected:
            work.append(JitWork("deep_gemm", "m_grouped_fp8_gemm_nt_masked", layer.n, layer.k,
                                layer.num_groups, tuple(expected), spec=_deep_gemm_spec(env)))
        return work


class TritonOrDeepGemmExperts(WrapperKernel):
    """vLLM's MoE experts with E8M0 scales off: Triton below DeepGEMM's 128-row alignment,
    DeepGEMM from there."""

    name = "TritonOrDeepGemmExperts"
    op = "moe"
    schemes = ("fp8_block",)
    branches = (
        Branch("base", TritonExperts, 1, 127),
        Branch("fallback", DeepGemmExperts, 128, None),
    )

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        if env.deep_gemm_e8m0:
            return False, "VLLM_USE_DEEP_GEMM_E8M0=1 (vLLM's default) sends every M to DeepGEMM"
        return super().is_supported(env)


KERNELS: tuple[type[Kernel], ...] = (
    DeepGemmFp8BlockScaledMMKernel, DeepGemmExperts, DeepEPDeepGemmExperts,
    TritonOrDeepGemmExperts,
)
