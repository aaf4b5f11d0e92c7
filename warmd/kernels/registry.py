"""Every kernel warmd knows, per op family. Names follow the engines' own kernel classes so
that VLLM_DISABLED_KERNELS-style lists apply unchanged."""

from __future__ import annotations

from warmd.kernels.base import OK, Branch, Check, Environment, JitWork, Kernel, WrapperKernel
from warmd.models import Layer
from warmd.mvalues import MSpec, clip, grouped_m_values

MRange = tuple[int, int | None]

# DeepGEMM's shape rules as vLLM applies them before dispatching (should_use_deepgemm_for_
# fp8_linear: N % 64, K % 128; grouped contiguous layout: N and K % 128).
DEEPGEMM_LINEAR_N_MULTIPLE = 64
DEEPGEMM_K_MULTIPLE = 128
DEEPGEMM_GROUPED_MULTIPLE = 128
DEEPGEMM_BLOCK = (128, 128)


def _spec(generator: str, *args: object) -> tuple[tuple[str, object], ...]:
    return (("generator", generator), ("args", tuple(args)))


def deep_gemm_scale_format(env: Environment) -> str:
    """DeepGEMM's scale-factor format, part of its kernel config: packed UE8M0 on sm100,
    FP32 scales on sm90."""
    return "ue8m0" if env.target.capability[0] == 10 else "float32"


def _deep_gemm_spec(env: Environment) -> tuple[tuple[str, object], ...]:
    return (("scale_fmt", deep_gemm_scale_format(env)),)


def _fp8_block_128(layer: Layer) -> Check:
    if layer.quant != "fp8_block":
        return False, f"needs FP8 128x128 block-scaled weights; layer is {layer.quant}"
    if layer.block != DEEPGEMM_BLOCK:
        return False, f"needs 128x128 weight blocks; layer has {layer.block}"
    return OK


# ----- FP8 linear (block-scaled and per-tensor) -----

class DeepGemmFp8BlockScaledMMKernel(Kernel):
    name = "DeepGemmFp8BlockScaledMMKernel"
    op = "linear"
    library = "deep_gemm"
    capabilities = (9, 10)
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        ok, reason = _fp8_block_128(layer)
        if not ok:
            return ok, reason
        if layer.n % DEEPGEMM_LINEAR_N_MULTIPLE or layer.k % DEEPGEMM_K_MULTIPLE:
            return False, (f"DeepGEMM needs N % {DEEPGEMM_LINEAR_N_MULTIPLE} == 0 and "
                           f"K % {DEEPGEMM_K_MULTIPLE} == 0; layer has N={layer.n}, K={layer.k}")
        return OK

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        m = clip(mspec.values(layer.n, env.target.sms), *m_range)
        if not m:
            return []
        return [JitWork("deep_gemm", "fp8_gemm_nt", layer.n, layer.k, None, tuple(m),
                        spec=_deep_gemm_spec(env))]


class FlashInferFp8BlockScaledMMKernel(Kernel):
    name = "FlashInferFp8BlockScaledMMKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (9,)
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return _fp8_block_128(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [JitWork("flashinfer", "fp8_blockscale_gemm", module="fp8_blockscale_gemm_90",
                        spec=_spec("flashinfer.jit.gemm.fp8_blockscale:"
                                   "gen_fp8_blockscale_gemm_sm90_module"))]


class FlashInferFp8DeepGEMMDynamicBlockScaledKernel(WrapperKernel):
    """vLLM's dynamic kernel: FlashInfer's swapAB GEMM for M < 32, DeepGEMM for M >= 32."""

    name = "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    op = "linear"
    capabilities = (9,)
    schemes = ("fp8_block",)
    branches = (
        Branch("base", FlashInferFp8BlockScaledMMKernel, 1, 31),
        Branch("fallback", DeepGemmFp8BlockScaledMMKernel, 32, None),
    )


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


class FlashInferFP8ScaledMMLinearKernel(Kernel):
    name = "FlashInferFP8ScaledMMLinearKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (10,)
    schemes = ("fp8_tensor",)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [JitWork("flashinfer", "fp8_gemm_cutlass", module="fp8_gemm_cutlass",
                        spec=_spec("flashinfer.jit.gemm.core:gen_gemm_sm100_module_cutlass_fp8"))]


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

class FlashInferCutlassMxfp8LinearKernel(Kernel):
    name = "FlashInferCutlassMxfp8LinearKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (10, 12)
    schemes = ("mxfp8",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        ok, reason = super().can_implement(layer, env)
        if ok and (layer.n % 32 or layer.k % 32):
            return False, f"MXFP8 GEMM needs N and K % 32; layer has N={layer.n}, K={layer.k}"
        return ok, reason

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        sm = "sm120" if env.target.capability[0] == 12 else "sm100"
        module = "mxfp8_gemm_cutlass_sm120" if sm == "sm120" else "mxfp8_gemm_cutlass"
        return [JitWork("flashinfer", "mxfp8_gemm_cutlass", module=module,
                        spec=_spec(f"flashinfer.jit.gemm.core:gen_gemm_{sm}_module_cutlass_mxfp8"))]


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

def _experts_aligned(layer: Layer) -> Check:
    ok, reason = _fp8_block_128(layer)
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
    capabilities = (9, 10)
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
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        # python/sglang/srt/layers/moe/ep_moe/layer.py: DeepEPMoE only for the deepep a2a
        # backend; a plain --ep runs the Triton fused MoE.
        if env.moe_a2a_backend != "deepep":
            return False, ("SGLang runs DeepGEMM MoE only with DeepEP "
                           "(--moe-a2a-backend deepep)")
        return _experts_aligned(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        work = _contiguous_work(layer, env, mspec, m_range)
        expected = clip(mspec.values(layer.n, env.target.sms), *m_range)
        if expected:
            work.append(JitWork("deep_gemm", "m_grouped_fp8_gemm_nt_masked", layer.n, layer.k,
                                layer.num_groups, tuple(expected), spec=_deep_gemm_spec(env)))
        return work


class TritonExperts(Kernel):
    name = "TritonExperts"
    op = "moe"
    schemes = ("fp8_block", "fp8_tensor", "bf16")
    min_capability = (8, 0)


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


_DTYPES = ("bfloat16", "bfloat16", "bfloat16", "int32")


class FlashInferAttentionBackend(AttentionKernel):
    name = "FlashInferAttentionBackend"
    library = "flashinfer"
    min_capability = (8, 0)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        ok, reason = super().can_implement(layer, env)
        if not ok:
            return ok, reason
        if layer.param["head_dim"] not in (64, 128, 256):
            return False, f"head_dim {layer.param['head_dim']} not in 64/128/256"
        return OK

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        d = layer.param["head_dim"]
        backend = "fa3" if env.target.is_hopper else "fa2"
        decode = ("batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_"
                  f"dtype_idx_i32_head_dim_qk_{d}_head_dim_vo_{d}_posenc_0_use_swa_False_"
                  "use_logits_cap_False")
        prefill = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_"
                   f"dtype_idx_i32_head_dim_qk_{d}_head_dim_vo_{d}_posenc_0_use_swa_False_"
                   "use_logits_cap_False_f16qk_False" + ("_sm90" if backend == "fa3" else ""))
        return [
            JitWork("flashinfer", "batch_decode", module=decode,
                    spec=_spec("flashinfer.jit:gen_batch_decode_module", *_DTYPES, d, d, 0,
                               False, False)),
            JitWork("flashinfer", "batch_prefill", module=prefill,
                    spec=_spec("flashinfer.jit:gen_batch_prefill_module", backend, *_DTYPES, d,
                               d, 0, False, False, False)),
        ]


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


class CutlassMLABackend(FlashMLABackend):
    name = "CutlassMLABackend"
    capabilities = (10,)


class TritonMLABackend(FlashMLABackend):
    name = "TritonMLABackend"
    capabilities = ()


class FlashInferMLABackend(FlashMLABackend):
    name = "FlashInferMLABackend"
    library = "flashinfer"
    capabilities = (9, 10)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        ckv, kpe = layer.param["kv_lora_rank"], layer.param["qk_rope_head_dim"]
        backend = "fa3" if env.target.is_hopper else "fa2"
        module = ("batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
                  f"head_dim_ckv_{ckv}_head_dim_kpe_{kpe}_profiler_False_planabi2"
                  + ("_sm90" if backend == "fa3" else ""))
        return [JitWork("flashinfer", "batch_mla", module=module,
                        spec=_spec("flashinfer.jit:gen_batch_mla_module", backend, *_DTYPES, ckv,
                                   kpe, False))]


# ----- Activation and sampling -----

class FlashInferActivation(Kernel):
    name = "FlashInferActivation"
    op = "activation"
    library = "flashinfer"
    min_capability = (8, 0)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        act = layer.param.get("act")
        if act not in ("silu", "gelu", "gelu_tanh", "gelu_pytorch_tanh"):
            return False, f"no FlashInfer {act}_and_mul"
        return OK

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(layer.param["act"], layer.param["act"])
        return [JitWork("flashinfer", "act_and_mul", module=f"{act}_and_mul",
                        spec=_spec("flashinfer.jit:gen_act_and_mul_module", act))]


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


class FlashInferSampler(Kernel):
    name = "FlashInferSampler"
    op = "sampling"
    library = "flashinfer"
    min_capability = (8, 0)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [JitWork("flashinfer", "sampling", module="sampling",
                        spec=_spec("flashinfer.jit.sampling:gen_sampling_module"))]


class TorchSampler(Kernel):
    name = "TorchSampler"
    op = "sampling"


ALL_KERNELS: dict[str, type[Kernel]] = {
    cls.name: cls for cls in (
        DeepGemmFp8BlockScaledMMKernel, FlashInferFp8BlockScaledMMKernel,
        FlashInferFp8DeepGEMMDynamicBlockScaledKernel, CutlassFp8BlockScaledMMKernel,
        TritonFp8BlockScaledMMKernel, FlashInferFP8ScaledMMLinearKernel,
        CutlassFP8ScaledMMLinearKernel, TorchFP8ScaledMMLinearKernel,
        FlashInferCutlassMxfp8LinearKernel, EmulatedMxfp8LinearKernel, UnquantizedLinearKernel,
        DeepGemmExperts, DeepEPDeepGemmExperts, TritonExperts, TritonOrDeepGemmExperts,
        FlashInferAttentionBackend,
        FlashAttentionBackend, TritonAttentionBackend, FlashMLABackend, CutlassMLABackend,
        TritonMLABackend, FlashInferMLABackend, FlashInferActivation, SglKernelActivation,
        VllmCustomOpActivation, TorchActivation, FlashInferSampler, TorchSampler,
    )
}
