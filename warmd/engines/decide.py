"""What the engine's launch decides before any kernel is selected: which kernels its
environment and flags rule out, which M values its warmup and traffic reach, and how it
splits experts. Every decision that departs from the default is kept as a note for the plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from warmd.engines.environment import EngineEnv
from warmd.engines.launch import check_moe_backend
from warmd.engines.moe_backends import BATCHED_ALL2ALL, MoeChoice, sglang_fp8_moe, vllm_fp8_moe
from warmd.engines.rules import (
    BY_ID,
    sglang_default_chunked_prefill,
    vllm_default_max_tokens,
    vllm_refined_moe_block,
    vllm_relax_block_ms,
)
from warmd.engines.versions import VersionRange
from warmd.errors import WarmdInputError
from warmd.mvalues import MSpec, parse_mspec
from warmd.targets import Target

VLLM_DG_WARMUP = "vllm/model_executor/warmup/deep_gemm_warmup.py"
VLLM_MOE_CONFIG = "vllm/model_executor/layers/fused_moe/config.py"
SGLANG_DG_COMPILE = "python/sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"
SGLANG_DG_CONFIG = "python/sglang/srt/layers/deep_gemm_wrapper/configurer.py"

_DEEP_GEMM_LINEAR = ("DeepGemmFp8BlockScaledMMKernel",)
_VLLM_DEEP_GEMM_MOE = ("DeepGemmExperts", "TritonOrDeepGemmExperts")
# --attention-backend / VLLM_ATTENTION_BACKEND names -> warmd's kernel and its attention kind.
ATTENTION_BACKENDS = {
    "FLASH_ATTN": ("FlashAttentionBackend", "mha"),
    "FLASHINFER": ("FlashInferAttentionBackend", "mha"),
    "TRITON_ATTN": ("TritonAttentionBackend", "mha"),
    "FLASHMLA": ("FlashMLABackend", "mla"),
    "FLASHINFER_MLA": ("FlashInferMLABackend", "mla"),
    "CUTLASS_MLA": ("CutlassMLABackend", "mla"),
    "TRITON_MLA": ("TritonMLABackend", "mla"),
    "FLASH_ATTN_MLA": ("FlashAttnMLABackend", "mla"),
    # SGLang's trtllm_mla only (vLLM has no such --attention-backend value).
    "TRTLLM_MLA": ("TrtllmMLABackend", "mla"),
}
# VLLM_MOE_USE_DEEP_GEMM exists from 0.12.0 (vllm/envs.py; 0.11.0 has none).
VLLM_MOE_DEEP_GEMM_ENV = VersionRange((0, 12, 0), None)
# vLLM read VLLM_ATTENTION_BACKEND until 0.15.x (vllm/config/attention.py in 0.14.0); 0.16.0
# has only --attention-backend.
VLLM_ATTENTION_ENV_VERSIONS = VersionRange(None, (0, 16, 0))
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


@dataclass
class Decisions:
    """The engine's launch-time decisions for one plan."""

    mspec: MSpec
    disabled: dict[str, str] = field(default_factory=dict)  # kernel name -> why
    deep_gemm_e8m0: bool = True
    moe_a2a_backend: str = "none"
    notes: list[str] = field(default_factory=list)
    batch_invariant: bool = False

    def disable(self, names, reason: str) -> None:
        for name in names:
            self.disabled.setdefault(name, reason)


def check_expert_parallel(engine: str, tp: int, dp: int, ep: int) -> None:
    """vLLM has no EP size: --enable-expert-parallel spreads experts over all TP x DP ranks
    (FusedMoEParallelConfig.make in vllm/model_executor/layers/fused_moe/config.py)."""
    if engine == "vllm" and ep > 1 and ep != tp * dp:
        raise WarmdInputError(
            f"vLLM runs expert parallel over every TP x DP rank: --ep must be 1 or "
            f"{tp * dp} (--tp {tp} x --dp {dp}), got {ep}")


def moe_block_refinement(engine: str, version):
    """The engine's refinement of FP8 MoE weight blocks a TP shard does not fit (vLLM's
    refine_fp8_moe_block_shape, rule vllm-fp8-moe-block-refine), or None: the engine
    refuses the checkpoint so sharded (SGLang; vLLM before the rule)."""
    if engine == "vllm" and BY_ID["vllm-fp8-moe-block-refine"].versions.contains(version):
        return vllm_refined_moe_block
    return None


def moe_ranks(engine: str, tp: int, dp: int) -> int:
    """How many ranks one MoE layer spans. vLLM flattens DP into the MoE's TP group (or its EP
    group with expert parallel); SGLang's MoE stays inside the TP group."""
    return tp * dp if engine == "vllm" else tp


def _explain(env: EngineEnv, name: str, value, what: str, source: str) -> str:
    how = f"{name}={env.raw(name)}" if env.is_set(name) else \
        f"{name} defaults to {env.raw(name)} for this {env.engine} version"
    return f"{how}: {what} ({source})"


def decide(request, env: EngineEnv, target: Target) -> Decisions:
    """Apply the engine's environment and launch flags on the target GPU; raises on bad
    input."""
    if request.moe_backend is not None:
        check_moe_backend(request.engine, request.moe_backend)
    out = (_decide_sglang if request.engine == "sglang" else _decide_vllm)(request, env, target)
    unmodelled = [*request.unmodelled_args, *_read_not_followed(request)]
    if unmodelled:
        out.notes.append(f"not modelled by warmd, may change kernels: {', '.join(unmodelled)}")
    return out


# Launch arguments read from a serve command whose kernel effect warmd does not follow yet
# (docs/selection.md "Not followed yet"): SGLang's DP attention.
_READ_NOT_FOLLOWED = {"dp_attention": "--enable-dp-attention"}
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
# vLLM's --linear-backend values and the kernels of each that warmd knows (rule
# vllm-linear-backend: kernels/linear/__init__.py _LINEAR_BACKEND_KERNEL_MAP, 0.34.0).
VLLM_LINEAR_BACKENDS = {
    "cutlass": ("CutlassFp8BlockScaledMMKernel", "CutlassFP8ScaledMMLinearKernel"),
    "flashinfer_cutlass": ("FlashInferFP8ScaledMMLinearKernel",
                           "FlashInferFp8DeepGEMMDynamicBlockScaledKernel",
                           "FlashInferCutlassMxfp8LinearKernel"),
    "flashinfer_cutedsl": ("FlashInferCutedslMxfp8LinearKernel",),
    "marlin": ("MarlinMxfp8LinearKernel",),
    "triton": ("TritonFp8BlockScaledMMKernel",),
    "deep_gemm": ("DeepGemmFp8BlockScaledMMKernel",),
    "torch": ("TorchFP8ScaledMMLinearKernel",),
    "emulation": ("EmulatedMxfp8LinearKernel",),
}


def _read_not_followed(request) -> list[str]:
    given = dict(getattr(request, "launch_args", ()) or ())
    out = [f"{flag} {given[name]}" if given[name] != "True" else flag
           for name, flag in _READ_NOT_FOLLOWED.items() if name in given]
    gemm = given.get("fp8_gemm_backend")
    if gemm not in (None, "auto", *SGLANG_FP8_GEMM_BACKENDS):
        out.append(f"--fp8-gemm-backend {gemm}")
    return out


def _user_mspec(request, max_tokens: int) -> MSpec | None:
    if request.m_list:
        return parse_mspec("relax", max_tokens, request.m_list)
    return None


def _launch_arg(request, name: str) -> str | None:
    return dict(getattr(request, "launch_args", ()) or ()).get(name)


# vLLM read VLLM_FUSED_MOE_CHUNK_SIZE as the grouped GEMM token cap until 0.33.0 (0.33.0 and
# 0.34.0 have no such variable in envs.py; rule vllm-grouped-m).
VLLM_CHUNK_SIZE_VERSIONS = VersionRange(None, (0, 33, 0))


def _vllm_max_tokens(request, env: EngineEnv, target: Target, notes: list[str]) -> int:
    if request.max_tokens is not None:
        return request.max_tokens
    a2a = _launch_arg(request, "all2all_backend")
    batched = a2a in ("deepep_low_latency", "nixl_ep") and request.ep > 1 and request.dp > 1
    tokens, note = vllm_default_max_tokens(target, env.version,
                                           _launch_arg(request, "performance_mode"), batched)
    notes.append(note)
    return tokens


def vllm_all2all(request) -> str:
    """The all2all backend vLLM's MoE runs (FusedMoEParallelConfig.use_all2all_kernels: expert
    parallel with DP > 1; rule vllm-moe-activation-format), else "none"."""
    if request.ep > 1 and request.dp > 1:
        return _launch_arg(request, "all2all_backend") or "allgather_reducescatter"
    return "none"


def _decide_vllm(request, env: EngineEnv, target: Target) -> Decisions:
    warmup = env.get("VLLM_DEEP_GEMM_WARMUP")
    mode = request.mode or ("full" if warmup == "full" else "relax")
    notes: list[str] = []
    max_tokens = _vllm_max_tokens(request, env, target, notes)
    moe_tokens = request.dp * max_tokens
    chunk = None
    if VLLM_CHUNK_SIZE_VERSIONS.contains(env.version):
        chunk = env.get("VLLM_FUSED_MOE_CHUNK_SIZE")
        moe_tokens = min(moe_tokens, chunk)
    mspec = _user_mspec(request, max_tokens) or parse_mspec(mode, max_tokens)
    mspec = MSpec(mspec.mode, mspec.max_tokens, mspec.explicit, moe_tokens,
                  vllm_relax_block_ms(env.version))
    out = Decisions(mspec, deep_gemm_e8m0=env.get("VLLM_USE_DEEP_GEMM_E8M0") is not False,
                    notes=notes, moe_a2a_backend=vllm_all2all(request))
    if request.mode is None and env.is_set("VLLM_DEEP_GEMM_WARMUP"):
        extra = "; warmd still warms the relax set" if warmup == "skip" else ""
        out.notes.append(_explain(env, "VLLM_DEEP_GEMM_WARMUP", warmup,
                                  f"M mode {mode}{extra}", VLLM_DG_WARMUP))
    if chunk is not None and (request.dp > 1 or moe_tokens < max_tokens * request.dp):
        out.notes.append(
            f"grouped GEMM tokens = min(DP {request.dp} x {max_tokens}, "
            f"VLLM_FUSED_MOE_CHUNK_SIZE {chunk}) = {moe_tokens} ({VLLM_DG_WARMUP})")
    elif request.dp > 1:
        out.notes.append(f"grouped GEMM tokens = DP {request.dp} x {max_tokens} = "
                         f"{moe_tokens} ({BY_ID['vllm-grouped-m'].cite()})")
    if env.is_set("VLLM_FUSED_MOE_CHUNK_SIZE") and chunk is None:
        out.notes.append("VLLM_FUSED_MOE_CHUNK_SIZE is not read by this vLLM (gone from "
                         "vllm/envs.py in 0.33.0)")
    if env.get("VLLM_USE_DEEP_GEMM") is False:
        reason = _explain(env, "VLLM_USE_DEEP_GEMM", False, "no DeepGEMM kernels", "vllm/envs.py")
        out.disable(_DEEP_GEMM_LINEAR + _VLLM_DEEP_GEMM_MOE, reason)
        out.notes.append(reason)
    if env.get("VLLM_MOE_USE_DEEP_GEMM") is False and VLLM_MOE_DEEP_GEMM_ENV.contains(env.version):
        reason = _explain(env, "VLLM_MOE_USE_DEEP_GEMM", False, "no DeepGEMM MoE",
                          VLLM_DG_WARMUP)
        out.disable(_VLLM_DEEP_GEMM_MOE, reason)
        out.notes.append(reason)
    if env.get("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER") is False:
        reason = _explain(env, "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", False,
                          "no FlashInfer FP8 block GEMM: M < 32 goes to DeepGEMM too",
                          "vllm/model_executor/layers/quantization/utils/fp8_utils.py")
        out.disable(("FlashInferFp8DeepGEMMDynamicBlockScaledKernel",), reason)
        out.notes.append(reason)
    if env.get("VLLM_USE_FLASHINFER_SAMPLER") is False:
        reason = _explain(env, "VLLM_USE_FLASHINFER_SAMPLER", False, "PyTorch sampler",
                          "vllm/v1/sample/ops/topk_topp_sampler.py")
        out.disable(("FlashInferSampler",), reason)
        out.notes.append(reason)
    if not env.get("VLLM_USE_DEEP_GEMM_E8M0"):
        out.notes.append(_explain(env, "VLLM_USE_DEEP_GEMM_E8M0", False,
                                  "MoE below 128 rows runs Triton", "vllm/utils/deep_gemm.py"))
    backend = request.attention_backend
    how = f"--attention-backend {backend}"
    if not backend and env.is_set("VLLM_ATTENTION_BACKEND"):
        if VLLM_ATTENTION_ENV_VERSIONS.contains(env.version):
            backend = env.get("VLLM_ATTENTION_BACKEND")
            how = f"VLLM_ATTENTION_BACKEND={backend}"
        else:
            out.notes.append(f"VLLM_ATTENTION_BACKEND={env.raw('VLLM_ATTENTION_BACKEND')} is "
                             "not read by this vLLM (0.16.0 dropped it for "
                             "--attention-backend; vllm/config/attention.py)")
    if backend:
        if backend == "TRTLLM_MLA":  # SGLang's name, not one of vLLM's backends
            raise WarmdInputError(f"unknown attention backend {backend!r} ({how})")
        _force_attention(out, (backend,), how)
    _linear_backend(out, _launch_arg(request, "linear_backend"))
    for name in env.get("VLLM_DISABLED_KERNELS"):
        out.disable((name,), "disabled by VLLM_DISABLED_KERNELS")
    if env.get("VLLM_BATCH_INVARIANT"):
        out.batch_invariant = True
        out.notes.append(_explain(env, "VLLM_BATCH_INVARIANT", True,
                                  "Triton fused MoE runs one default config, no tuned table",
                                  BY_ID["vllm-triton-moe-configs"].cite()))
    return out


def _linear_backend(out: Decisions, backend: str | None) -> None:
    """--linear-backend: for each linear quantization scheme with a kernel of that backend,
    only those kernels (a wrapper's branches with it); a scheme without one keeps vLLM's
    automatic choice (_resolve_backend_kernels falls back to the whole list)."""
    from warmd.kernels.selection import ALL_KERNELS

    if backend in (None, "auto"):
        return
    chosen = set(VLLM_LINEAR_BACKENDS.get(backend, ()))
    kept = set(chosen)
    for name in chosen:
        kept |= {b.kernel.name for b in _branches(ALL_KERNELS[name])}
    where = BY_ID["vllm-linear-backend"].cite()
    followed = []
    for scheme in ("fp8_block", "fp8_tensor", "mxfp8"):
        family = [k.name for k in ALL_KERNELS.values() if k.op == "linear" and
                  scheme in k.schemes and k.name not in kept - chosen]
        mine = [name for name in family if name in chosen]
        if mine:
            out.disable([n for n in family if n not in chosen],
                        f"--linear-backend {backend} selects {', '.join(mine)}")
            followed.append(f"{scheme}: {', '.join(mine)}")
    if followed:
        out.notes.append(f"--linear-backend {backend}: {'; '.join(followed)} ({where})")
    else:
        out.notes.append(f"--linear-backend {backend}: no kernel of it for this model's "
                         f"linear layers that warmd knows; vLLM keeps its automatic choice "
                         f"({where})")


def _branches(kernel):
    for branch in kernel.branches:
        yield branch
        yield from _branches(branch.kernel)


def _force_attention(out: Decisions, backends: tuple[str, ...], how: str) -> None:
    """Disable every other backend of the kinds (MHA, MLA) the named backends implement."""
    unknown = [b for b in backends if b not in ATTENTION_BACKENDS]
    if unknown:
        raise WarmdInputError(f"unknown attention backend {unknown[0]!r} ({how}); known: "
                              f"{', '.join(ATTENTION_BACKENDS)}")
    chosen = {ATTENTION_BACKENDS[b][1]: ATTENTION_BACKENDS[b][0] for b in backends}
    for kind, kernel in chosen.items():
        others = [name for name, k in ATTENTION_BACKENDS.values() if k == kind and name != kernel]
        out.disable(others, f"{how} selects {kernel}")
    out.notes.append(f"{how}: attention runs {' / '.join(chosen.values())}")


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


def _decide_sglang(request, env: EngineEnv, target: Target) -> Decisions:
    cps = request.chunked_prefill_size
    cps_default = None
    if cps is None:
        cps, cps_default = sglang_default_chunked_prefill(target)
    fast = bool(env.get("SGLANG_JIT_DEEPGEMM_FAST_WARMUP"))
    mode = request.mode or ("fast" if fast else "full")
    default_max = sglang_fast_max(cps) if mode == "fast" else sglang_m_max(cps)
    max_tokens = default_max if request.max_tokens is None else request.max_tokens
    mspec = _user_mspec(request, max_tokens) or parse_mspec(mode, max_tokens)
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
            out.notes.append(_explain(env, "SGLANG_JIT_DEEPGEMM_FAST_WARMUP", fast,
                                      f"M mode {mode}", SGLANG_DG_COMPILE))
    if env.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE") is False:
        out.notes.append(_explain(env, "SGLANG_JIT_DEEPGEMM_PRECOMPILE", False,
                                  "SGLang compiles these in traffic; warmd warms them now",
                                  SGLANG_DG_COMPILE))
    if env.get("SGLANG_ENABLE_JIT_DEEPGEMM") is False:
        reason = _explain(env, "SGLANG_ENABLE_JIT_DEEPGEMM", False, "no DeepGEMM kernels",
                          SGLANG_DG_CONFIG)
        out.disable(_DEEP_GEMM_LINEAR + ("DeepEPDeepGemmExperts", "DeepGemmRunnerExperts"),
                    reason)
        out.notes.append(reason)
    if request.ep > 1 and a2a != "deepep":
        out.notes.append(f"--ep {request.ep} without --moe-a2a-backend deepep: MoE runs "
                         "Triton (python/sglang/srt/layers/moe/ep_moe/layer.py)")
    _sglang_fp8_gemm_backend(out, _launch_arg(request, "fp8_gemm_backend"))
    backend = request.attention_backend
    if backend is None and _sglang_trtllm_mla(request, target):
        rule = BY_ID["sglang-deepseek-trtllm-mla"]
        _force_attention(out, ("TRTLLM_MLA",),
                         f"SGLang's default on sm100 for the DeepSeek-V3 family ({rule.cite()})")
    elif backend == "trtllm_mla":
        _force_attention(out, ("TRTLLM_MLA",), "--attention-backend trtllm_mla")
    elif backend in SGLANG_OTHER_ATTENTION_BACKENDS:
        out.notes.append(f"--attention-backend {backend}: not modelled by warmd; attention "
                         "follows SGLang's default order")
    elif backend:
        names = SGLANG_ATTENTION_BACKENDS.get(backend)
        if names is None:
            known = (*SGLANG_ATTENTION_BACKENDS, *SGLANG_OTHER_ATTENTION_BACKENDS)
            raise WarmdInputError(f"unknown SGLang attention backend {backend!r}; known: "
                                  f"{', '.join(known)}")
        _force_attention(out, names, f"--attention-backend {backend}")
    return out


def _sglang_fp8_gemm_backend(out: Decisions, backend: str | None) -> None:
    """--fp8-gemm-backend for block-FP8 linear layers: a backend warmd knows keeps only its
    kernel (triton: no DeepGEMM linear work); another is named as not modelled."""
    from warmd.kernels.selection import ALL_KERNELS

    if backend in (None, "auto"):
        return
    chosen = SGLANG_FP8_GEMM_BACKENDS.get(backend)
    if chosen is None:
        return  # named as not modelled (_read_not_followed)
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


def moe_preference(request, env: EngineEnv, capability: tuple[int, int],
                   model) -> MoeChoice | None:
    """The moe.fp8 preference the engine's launch decides for this model and GPU (vLLM's FP8
    MoE oracle, SGLang's --moe-runner-backend); None when the model has no FP8 MoE layer or
    the engine's default order holds."""
    from warmd.kernels.preferences import PREFERENCES, family_of, platform_of

    moe = [layer for layer in model.layers if layer.op == "moe"
           and family_of(layer.op, layer.quant) == "moe.fp8"]
    if not moe:
        return None
    if request.engine == "sglang":
        default = PREFERENCES["sglang"][platform_of(capability)]["moe.fp8"]
        return sglang_fp8_moe(request.moe_backend, capability, model.model_type,
                              request.moe_a2a_backend or "none", tuple(default))
    block = any(layer.quant == "fp8_block" and layer.block == (128, 128) for layer in moe)
    moe_tp = 1 if request.ep > 1 else request.tp * request.dp
    batched = vllm_all2all(request) in BATCHED_ALL2ALL
    choice = vllm_fp8_moe(env, capability, block, request.ep, moe_tp, request.moe_backend,
                          batched)
    refined = next((layer for layer in moe if layer.param.get("refined_from")), None)
    if refined is None:
        return choice
    note = (f"FP8 MoE blocks {refined.param['refined_from']} do not fit "
            f"{refined.param['intermediate']} intermediate per rank: vLLM refines the scales "
            f"to {refined.block[0]}x{refined.block[1]}, which only Triton MoE takes "
            f"({BY_ID['vllm-fp8-moe-block-refine'].cite()})")
    return replace(choice, notes=(*choice.notes, note))


def refuse_unfit_forced(selections, choice: MoeChoice | None) -> None:
    """A backend the launch forces but that cannot run: the engine refuses to start (vLLM's
    oracle raises ValueError; so does its attention selector for a named backend the GPU
    cannot run, e.g. FLASHINFER_MLA on Hopper), so the plan is bad input too."""
    for selection in selections:
        forced = [r for r in selection.rejected if " selects " in r.reason]
        if selection.family.startswith("attention") and selection.kernel is None and forced:
            how = forced[0].reason.split(" selects ")[0]
            why = "; ".join(f"{r.kernel}: {r.reason}" for r in selection.rejected
                            if r not in forced)
            raise WarmdInputError(f"{how} cannot run {selection.layer.name} here, so the "
                                  f"engine would not start ({why})")
    if choice is None or choice.forced_by is None:
        return
    for selection in selections:
        if selection.family == "moe.fp8" and selection.kernel is None:
            why = "; ".join(f"{r.kernel}: {r.reason}" for r in selection.rejected)
            raise WarmdInputError(f"{choice.forced_by} cannot run {selection.layer.name} "
                                  f"here, so the engine would not start ({why})")
