"""SGLang's launch decisions: its environment and flags applied to the kernels, the M values
its DeepGEMM precompile reaches, --fp8-gemm-backend and its attention backends."""

from __future__ import annotations

from warmd.engines.decisions import (
    DEEP_GEMM_LINEAR,
    Decisions,
    explain,
    force_attention,
    launch_arg,
    user_mspec,
)
from warmd.engines.environment import EngineEnv
from warmd.engines.rules import BY_ID, sglang_default_chunked_prefill
from warmd.errors import WarmdInputError
from warmd.mvalues import parse_mspec
from warmd.targets import Target

SGLANG_DG_COMPILE = "python/sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"
SGLANG_DG_CONFIG = "python/sglang/srt/layers/deep_gemm_wrapper/configurer.py"
# SGLang's --attention-backend spellings for the same kernels: one name serves MHA and MLA
# models alike (python/sglang/srt/layers/attention/: fa3, flashinfer and triton each have an
# MLA variant).
SGLANG_ATTENTION_BACKENDS = {"fa3": ("FLASH_ATTN", "FLASH_ATTN_MLA"),
                             "flashinfer": ("FLASHINFER", "FLASHINFER_MLA"),
                             "triton": ("TRITON_ATTN", "TRITON_MLA"), "flashmla": ("FLASHMLA",),
                             "cutlass_mla": ("CUTLASS_MLA",)}
# The rest of SGLang's ATTENTION_BACKEND_CHOICES (server_args.py, 0.5.23): valid, not
# modelled by warmd (the plan keeps its default order and says so).
SGLANG_OTHER_ATTENTION_BACKENDS = (
    "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed", "fa4",
    "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "dual_chunk_flash_attn", "hpc_ops",
    "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend",
    "intel_xpu")

# SGLang's --fp8-gemm-backend values whose block-FP8 linear kernel warmd knows (rule
# sglang-fp8-gemm-backend, fp8_utils.py _dispatch_explicit_backend); the others stay named
# as not modelled.
SGLANG_FP8_GEMM_BACKENDS = {"triton": "TritonFp8BlockScaledMMKernel",
                            "deep_gemm": "DeepGemmFp8BlockScaledMMKernel",
                            "cutlass": "CutlassFp8BlockScaledMMKernel"}
# SGLang's DeepSeek-V3 family (model_overrides/deepseek_v2.py _deepseek_family_overrides'
# registration, less the DSA models, which run dsa attention).
SGLANG_TRTLLM_MLA_ARCHS = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration",
                           "MistralLarge3ForCausalLM")


def sglang_m_max(chunked_prefill_size: int | None) -> int:
    """SGLang's precompile range: every M up to 16384, 2 x --chunked-prefill-size above 8192,
    65536 without chunked prefill, at most 131072 (update_deep_gemm_config)."""
    if chunked_prefill_size is None:
        return 16 * 1024
    m_max = 16 * 1024
    if chunked_prefill_size < 1:
        m_max = 64 * 1024
    elif chunked_prefill_size > 8192:
        m_max = chunked_prefill_size * 2
    return min(128 * 1024, m_max)


def sglang_fast_max(chunked_prefill_size: int | None) -> int:
    """The largest prefill batch of SGLang's fast warmup set (update_deep_gemm_config)."""
    if chunked_prefill_size is not None and chunked_prefill_size >= 1:
        return min(chunked_prefill_size, 32 * 1024)
    return 16 * 1024


def decide_sglang(request, env: EngineEnv, target: Target) -> Decisions:
    cps = request.chunked_prefill_size
    cps_default = None
    if cps is None:
        cps, cps_default = sglang_default_chunked_prefill(target)
    fast = bool(env.get("SGLANG_JIT_DEEPGEMM_FAST_WARMUP"))
    mode = request.mode or ("fast" if fast else "full")
    default_max = sglang_fast_max(cps) if mode == "fast" else sglang_m_max(cps)
    max_tokens = default_max if request.max_tokens is None else request.max_tokens
    mspec = user_mspec(request, max_tokens) or parse_mspec(mode, max_tokens)
    a2a = request.moe_a2a_backend or "none"
    out = Decisions(mspec, moe_a2a_backend=a2a)
    if cps_default is not None:
        out.notes.append(cps_default)
    if request.mode is None and request.max_tokens is None:
        what = (f"fast set up to {default_max}" if fast
                else f"every M up to {default_max}")
        cps_note = f"--chunked-prefill-size {cps}"
        out.notes.append(f"SGLang DeepGEMM precompile: {what} ({cps_note}; "
                         f"{SGLANG_DG_COMPILE})")
        if env.is_set("SGLANG_JIT_DEEPGEMM_FAST_WARMUP"):
            out.notes.append(explain(env, "SGLANG_JIT_DEEPGEMM_FAST_WARMUP", fast,
                                      f"M mode {mode}", SGLANG_DG_COMPILE))
    if env.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE") is False:
        out.notes.append(explain(env, "SGLANG_JIT_DEEPGEMM_PRECOMPILE", False,
                                  "SGLang compiles these in traffic; warmd warms them now",
                                  SGLANG_DG_COMPILE))
    if env.get("SGLANG_ENABLE_JIT_DEEPGEMM") is False:
        reason = explain(env, "SGLANG_ENABLE_JIT_DEEPGEMM", False, "no DeepGEMM kernels",
                          SGLANG_DG_CONFIG)
        out.disable(DEEP_GEMM_LINEAR + ("DeepEPDeepGemmExperts", "DeepGemmRunnerExperts"),
                    reason)
        out.notes.append(reason)
    if request.ep > 1 and a2a != "deepep":
        out.notes.append(f"--ep {request.ep} without --moe-a2a-backend deepep: MoE runs "
                         "Triton (python/sglang/srt/layers/moe/ep_moe/layer.py)")
    _sglang_fp8_gemm_backend(out, launch_arg(request, "fp8_gemm_backend"))
    backend = request.attention_backend
    if backend is None and _sglang_trtllm_mla(request, target):
        rule = BY_ID["sglang-deepseek-trtllm-mla"]
        force_attention(out, ("TRTLLM_MLA",),
                         f"SGLang's default on sm100 for the DeepSeek-V3 family ({rule.cite()})")
    elif backend == "trtllm_mla":
        force_attention(out, ("TRTLLM_MLA",), "--attention-backend trtllm_mla")
    elif backend in SGLANG_OTHER_ATTENTION_BACKENDS:
        out.notes.append(f"--attention-backend {backend}: not modelled by warmd; attention "
                         "follows SGLang's default order")
    elif backend:
        names = SGLANG_ATTENTION_BACKENDS.get(backend)
        if names is None:
            known = (*SGLANG_ATTENTION_BACKENDS, *SGLANG_OTHER_ATTENTION_BACKENDS)
            raise WarmdInputError(f"unknown SGLang attention backend {backend!r}; known: "
                                  f"{', '.join(known)}")
        force_attention(out, names, f"--attention-backend {backend}")
    return out


def _sglang_fp8_gemm_backend(out: Decisions, backend: str | None) -> None:
    """--fp8-gemm-backend for block-FP8 linear layers: a backend warmd knows keeps only its
    kernel (triton: no DeepGEMM linear work); another is named as not modelled."""
    from warmd.kernels.selection import ALL_KERNELS

    if backend in (None, "auto"):
        return
    chosen = SGLANG_FP8_GEMM_BACKENDS.get(backend)
    if chosen is None:
        return  # named as not modelled (warmd.engines.decide)
    others = [k.name for k in ALL_KERNELS.values() if k.op == "linear" and
              "fp8_block" in k.schemes and k.name != chosen]
    out.disable(others, f"--fp8-gemm-backend {backend} selects {chosen}")
    out.notes.append(f"--fp8-gemm-backend {backend}: block-FP8 linear runs {chosen} "
                     f"({BY_ID['sglang-fp8-gemm-backend'].cite()})")


def _sglang_trtllm_mla(request, target: Target) -> bool:
    """Whether SGLang sets --attention-backend trtllm_mla itself (rule
    sglang-deepseek-trtllm-mla): sm100, a DeepSeek-V3-family architecture without DSA, no
    attention backend of any phase given."""
    from warmd.engines.hub import resolve_model
    from warmd.models import language_config
    from warmd.models.config_json import load_config

    given = {arg.split()[0] for arg in request.unmodelled_args}
    if target.capability[0] != 10 or given & {"--prefill-attention-backend",
                                              "--decode-attention-backend"}:
        return False
    raw = load_config(resolve_model(request.model))[0]
    archs = set(raw.get("architectures") or ())
    return bool(archs & set(SGLANG_TRTLLM_MLA_ARCHS)) and \
        "index_topk" not in language_config(raw)
