"""FlashInfer's kernels as the engines dispatch to them, with the JIT module each needs (its
name and the FlashInfer generator that makes its spec)."""

from __future__ import annotations

from warmd.kernels.base import (
    OK,
    Branch,
    Check,
    Environment,
    Kernel,
    MRange,
    WrapperKernel,
    fp8_block_128,
)
from warmd.kernels.registry import AttentionKernel, FlashMLABackend
from warmd.libraries.deep_gemm.kernels import DeepGemmFp8BlockScaledMMKernel
from warmd.models import Layer
from warmd.mvalues import MSpec
from warmd.tasks import Task


def _spec(generator: str, *args: object) -> dict[str, object]:
    return {"generator": generator, "args": tuple(args)}


_DTYPES = ("bfloat16", "bfloat16", "bfloat16", "int32")


class FlashInferFp8BlockScaledMMKernel(Kernel):
    name = "FlashInferFp8BlockScaledMMKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (9,)
    schemes = ("fp8_block",)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return fp8_block_128(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [Task("flashinfer", "fp8_blockscale_gemm", module="fp8_blockscale_gemm_90",
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


class FlashInferFP8ScaledMMLinearKernel(Kernel):
    name = "FlashInferFP8ScaledMMLinearKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (10,)
    schemes = ("fp8_tensor",)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [Task("flashinfer", "fp8_gemm_cutlass", module="fp8_gemm_cutlass",
                     spec=_spec("flashinfer.jit.gemm.core:gen_gemm_sm100_module_cutlass_fp8"))]


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
        return [Task("flashinfer", "mxfp8_gemm_cutlass", module=module,
                     spec=_spec(f"flashinfer.jit.gemm.core:gen_gemm_{sm}_module_cutlass_mxfp8"))]


class FlashInferCutedslMxfp8LinearKernel(Kernel):
    """vLLM 0.34.0's first MXFP8 kernel (rule vllm-mxfp8-cutedsl): FlashInfer's CuTe-DSL
    MXFP8 GEMM, sm100/sm103, needing FlashInfer's CuTe-DSL module (nvidia-cutlass-dsl). The
    CuTe DSL compiles it at the engine's start; warmd has no executor for CuTe DSL yet."""

    name = "FlashInferCutedslMxfp8LinearKernel"
    op = "linear"
    library = "flashinfer"
    capabilities = (10,)
    schemes = ("mxfp8",)

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        ok, reason = super().is_supported(env)
        if ok and env.target.capability not in ((10, 0), (10, 3)):
            return False, "needs sm_100/sm_103"
        dsl = env.library("cutlass_dsl")
        if ok and not dsl.available:
            return False, f"FlashInfer's CuTe-DSL module needs cutlass_dsl: {dsl.reason}"
        return ok, reason

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return FlashInferCutlassMxfp8LinearKernel.can_implement(layer, env)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return (f"CuTe DSL MXFP8 GEMM (FlashInfer mm_mxfp8, N={layer.n} K={layer.k}): compiled "
                "at the engine's start; no executor here")


# FlashInfer builds the H20 (78 SMs) variant of the sm90 fused-MoE module on an H20
# (flashinfer/jit/fused_moe.py, _should_enable_sm90_moe_prebuilt_d_descriptor).
_H20_SMS = 78


class FlashInferFusedMoE(Kernel):
    """A vLLM FP8 MoE backend on FlashInfer's fused MoE: 128x128 block FP8 (kFp8Static128BlockSym
    x kFp8Dynamic128Sym) and per-tensor FP8 with static activation scales (kFp8StaticTensorSym
    for both); one module serves every expert shape."""

    op = "moe"
    library = "flashinfer"
    schemes = ("fp8_block", "fp8_tensor")
    block_capabilities: tuple[int, ...] = ()  # GPU generations of the block FP8 scheme

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        if layer.quant == "fp8_tensor":
            if layer.param.get("act_scales") != "static":
                return False, ("per-tensor FP8 needs static activation scales; the "
                               "checkpoint's are dynamic")
            return OK
        ok, reason = fp8_block_128(layer)
        if ok and env.target.capability[0] not in cls.block_capabilities:
            return False, f"block FP8 on sm{cls.block_capabilities[0]}x only"
        return ok, reason


class FlashInferExperts(FlashInferFusedMoE):
    """FLASHINFER_CUTLASS (fused_moe/experts/flashinfer_cutlass_moe.py): cutlass_fused_moe;
    _supports_quant_scheme: block FP8 on sm90 only, static per-tensor FP8 from sm90."""

    name = "FlashInferExperts"
    capabilities = (9, 10, 12)
    block_capabilities = (9,)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        # fused_moe/core.py get_cutlass_fused_moe_module: one module per GPU generation
        # (sm90 builds fused_moe_90, the H20 variant on an H20).
        major, minor = env.target.capability
        if major == 9:
            module = "fused_moe_90_h20_prebuilt_d" if env.target.sms == _H20_SMS \
                else "fused_moe_90"
            generator = "gen_cutlass_fused_moe_sm90_module"
        else:
            arch = {(10, 3): "103"}.get((major, minor), "120" if major == 12 else "100")
            module, generator = f"fused_moe_{arch}", f"gen_cutlass_fused_moe_sm{arch}_module"
        return [Task("flashinfer", "cutlass_fused_moe", module=module,
                     spec=_spec(f"flashinfer.jit.fused_moe:{generator}"))]


class TrtLlmFp8Experts(FlashInferFusedMoE):
    """FLASHINFER_TRTLLM (fused_moe/experts/trtllm_fp8_moe.py): the TRT-LLM-gen fused MoE, sm100
    family only. Its module also links kernels FlashInfer fetches as cubins (flashinfer-cubin or
    a download), so building it needs those besides nvcc."""

    name = "TrtLlmFp8Experts"
    capabilities = (10,)
    block_capabilities = (10,)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        rubin = env.target.capability == (10, 7)
        module = "fused_moe_trtllm_sm107" if rubin else "fused_moe_trtllm_sm100"
        return [Task("flashinfer", "trtllm_fused_moe", module=module,
                     spec=_spec("flashinfer.jit.fused_moe:gen_trtllm_gen_fused_moe_sm100_module",
                                rubin))]


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
        trtllm = _vllm_trtllm_attention(env)
        if trtllm == "prefill and decode":
            return []
        decode = ("batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_"
                  f"dtype_idx_i32_head_dim_qk_{d}_head_dim_vo_{d}_posenc_0_use_swa_False_"
                  "use_logits_cap_False")
        prefill = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_"
                   f"dtype_idx_i32_head_dim_qk_{d}_head_dim_vo_{d}_posenc_0_use_swa_False_"
                   "use_logits_cap_False_f16qk_False" + ("_sm90" if backend == "fa3" else ""))
        work = [
            Task("flashinfer", "batch_decode", module=decode,
                 spec=_spec("flashinfer.jit:gen_batch_decode_module", *_DTYPES, d, d, 0,
                            False, False)),
            Task("flashinfer", "batch_prefill", module=prefill,
                 spec=_spec("flashinfer.jit:gen_batch_prefill_module", backend, *_DTYPES, d,
                            d, 0, False, False, False)),
        ]
        return work[1:] if trtllm == "decode" else work

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        trtllm = _vllm_trtllm_attention(env)
        if trtllm is None:
            return None
        return (f"FlashInfer TRT-LLM-gen attention ({trtllm}): kernels FlashInfer loads at the "
                "engine's start; no executor here")


def _vllm_rule(env: Environment, rule_id: str) -> bool:
    from warmd.engines.rules import BY_ID

    return env.engine == "vllm" and BY_ID[rule_id].versions.contains(env.engine_version)


def _vllm_trtllm_attention(env: Environment) -> str | None:
    """What of vLLM's FlashInfer MHA runs TRT-LLM-gen kernels (rule vllm-trtllm-attention,
    vllm/utils/flashinfer.py supports_trtllm_attention): prefill and decode on the sm100
    family, decode on sm120; None elsewhere (and for SGLang, modelled apart)."""
    if not _vllm_rule(env, "vllm-trtllm-attention"):
        return None
    if env.target.capability[0] == 10:
        return "prefill and decode"
    if env.target.capability[0] == 12:
        return "decode"
    return None


class FlashInferMLABackend(FlashMLABackend):
    name = "FlashInferMLABackend"
    library = "flashinfer"
    capabilities = (9, 10)

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        # vLLM's FLASHINFER_MLA decodes with TRT-LLM-gen: sm100 only (rule
        # vllm-flashinfer-mla-sm100, supports_compute_capability: major == 10). SGLang's
        # flashinfer MLA runs the batch_mla module on Hopper too.
        if _vllm_rule(env, "vllm-flashinfer-mla-sm100") and env.target.capability[0] != 10:
            cap = env.target.capability
            return False, (f"vLLM's FLASHINFER_MLA runs on sm100 only (TRT-LLM-gen decode); "
                           f"target is sm_{cap[0]}{cap[1]}")
        return super().is_supported(env)

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        prefill = super().engine_jit(layer, env, mspec, m_range)
        if not _vllm_rule(env, "vllm-flashinfer-mla-sm100"):
            return prefill
        decode = ("FlashInfer TRT-LLM-gen MLA decode (trtllm_batch_decode_with_kv_cache_mla): "
                  "kernels FlashInfer loads at the engine's start; no executor here")
        return f"{decode}; {prefill}" if prefill else decode

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        if _vllm_rule(env, "vllm-flashinfer-mla-sm100"):
            return []  # TRT-LLM-gen decode, not the batch_mla module
        ckv, kpe = layer.param["kv_lora_rank"], layer.param["qk_rope_head_dim"]
        backend = "fa3" if env.target.is_hopper else "fa2"
        module = ("batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
                  f"head_dim_ckv_{ckv}_head_dim_kpe_{kpe}_profiler_False_planabi2"
                  + ("_sm90" if backend == "fa3" else ""))
        return [Task("flashinfer", "batch_mla", module=module,
                     spec=_spec("flashinfer.jit:gen_batch_mla_module", backend, *_DTYPES, ckv,
                                kpe, False))]


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
        return [Task("flashinfer", "act_and_mul", module=f"{act}_and_mul",
                     spec=_spec("flashinfer.jit:gen_act_and_mul_module", act))]


class FlashInferSampler(Kernel):
    name = "FlashInferSampler"
    op = "sampling"
    library = "flashinfer"
    min_capability = (8, 0)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [Task("flashinfer", "sampling", module="sampling",
                     spec=_spec("flashinfer.jit.sampling:gen_sampling_module"))]


KERNELS: tuple[type[Kernel], ...] = (
    FlashInferFp8BlockScaledMMKernel,
    FlashInferFp8DeepGEMMDynamicBlockScaledKernel,
    FlashInferFP8ScaledMMLinearKernel,
    FlashInferCutlassMxfp8LinearKernel,
    FlashInferCutedslMxfp8LinearKernel,
    FlashInferExperts,
    TrtLlmFp8Experts,
    FlashInferAttentionBackend,
    FlashInferMLABackend,
    FlashInferActivation,
    FlashInferSampler,
)
