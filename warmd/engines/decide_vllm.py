"""vLLM's launch decisions: its environment and flags applied to the kernels, the M values
its warmup and traffic reach, its all2all backend and --linear-backend."""

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
from warmd.engines.rules import BY_ID, vllm_default_max_tokens, vllm_relax_block_ms
from warmd.engines.versions import VersionRange
from warmd.errors import WarmdInputError
from warmd.mvalues import MSpec, parse_mspec
from warmd.targets import Target

VLLM_DG_WARMUP = "vllm/model_executor/warmup/deep_gemm_warmup.py"
VLLM_MOE_CONFIG = "vllm/model_executor/layers/fused_moe/config.py"
_VLLM_DEEP_GEMM_MOE = ("DeepGemmExperts", "TritonOrDeepGemmExperts")
# VLLM_MOE_USE_DEEP_GEMM exists from 0.12.0 (vllm/envs.py; 0.11.0 has none).
VLLM_MOE_DEEP_GEMM_ENV = VersionRange((0, 12, 0), None)
# vLLM read VLLM_ATTENTION_BACKEND until 0.15.x (vllm/config/attention.py in 0.14.0); 0.16.0
# has only --attention-backend.
VLLM_ATTENTION_ENV_VERSIONS = VersionRange(None, (0, 16, 0))
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


# vLLM's variables that, set false, switch kernels off: (variable, what vLLM runs then,
# where it reads it, the kernels off, the versions that read it; None: every one).
_SWITCHES: tuple[tuple[str, str, str, tuple[str, ...], VersionRange | None], ...] = (
    ("VLLM_USE_DEEP_GEMM", "no DeepGEMM kernels", "vllm/envs.py",
     DEEP_GEMM_LINEAR + _VLLM_DEEP_GEMM_MOE, None),
    ("VLLM_MOE_USE_DEEP_GEMM", "no DeepGEMM MoE", VLLM_DG_WARMUP, _VLLM_DEEP_GEMM_MOE,
     VLLM_MOE_DEEP_GEMM_ENV),
    ("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
     "no FlashInfer FP8 block GEMM: M < 32 goes to DeepGEMM too",
     "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
     ("FlashInferFp8DeepGEMMDynamicBlockScaledKernel",), None),
    ("VLLM_USE_FLASHINFER_SAMPLER", "PyTorch sampler", "vllm/v1/sample/ops/topk_topp_sampler.py",
     ("FlashInferSampler",), None),
)

# vLLM read VLLM_FUSED_MOE_CHUNK_SIZE as the grouped GEMM token cap until 0.33.0 (0.33.0 and
# 0.34.0 have no such variable in envs.py; rule vllm-grouped-m).
VLLM_CHUNK_SIZE_VERSIONS = VersionRange(None, (0, 33, 0))


def _vllm_max_tokens(request, env: EngineEnv, target: Target, notes: list[str]) -> int:
    if request.max_tokens is not None:
        return request.max_tokens
    a2a = launch_arg(request, "all2all_backend")
    batched = a2a in ("deepep_low_latency", "nixl_ep") and request.ep > 1 and request.dp > 1
    tokens, note = vllm_default_max_tokens(target, env.version,
                                           launch_arg(request, "performance_mode"), batched)
    notes.append(note)
    return tokens


def vllm_all2all(request) -> str:
    """The all2all backend vLLM's MoE runs (FusedMoEParallelConfig.use_all2all_kernels: expert
    parallel with DP > 1; rule vllm-moe-activation-format), else "none"."""
    if request.ep > 1 and request.dp > 1:
        return launch_arg(request, "all2all_backend") or "allgather_reducescatter"
    return "none"


def decide_vllm(request, env: EngineEnv, target: Target) -> Decisions:
    warmup = env.get("VLLM_DEEP_GEMM_WARMUP")
    mode = request.mode or ("full" if warmup == "full" else "relax")
    notes: list[str] = []
    max_tokens = _vllm_max_tokens(request, env, target, notes)
    moe_tokens = request.dp * max_tokens
    chunk = None
    if VLLM_CHUNK_SIZE_VERSIONS.contains(env.version):
        chunk = env.get("VLLM_FUSED_MOE_CHUNK_SIZE")
        moe_tokens = min(moe_tokens, chunk)
    mspec = user_mspec(request, max_tokens) or parse_mspec(mode, max_tokens)
    mspec = MSpec(mspec.mode, mspec.max_tokens, mspec.explicit, moe_tokens,
                  vllm_relax_block_ms(env.version))
    out = Decisions(mspec, deep_gemm_e8m0=env.get("VLLM_USE_DEEP_GEMM_E8M0") is not False,
                    notes=notes, moe_a2a_backend=vllm_all2all(request))
    if request.mode is None and env.is_set("VLLM_DEEP_GEMM_WARMUP"):
        extra = "; warmd still warms the relax set" if warmup == "skip" else ""
        out.notes.append(explain(env, "VLLM_DEEP_GEMM_WARMUP", warmup,
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
    for var, effect, where, kernels, read_in in _SWITCHES:
        if env.get(var) is False and (read_in is None or read_in.contains(env.version)):
            reason = explain(env, var, False, effect, where)
            out.disable(kernels, reason)
            out.notes.append(reason)
    if not env.get("VLLM_USE_DEEP_GEMM_E8M0"):
        out.notes.append(explain(env, "VLLM_USE_DEEP_GEMM_E8M0", False,
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
        force_attention(out, (backend,), how)
    _linear_backend(out, launch_arg(request, "linear_backend"))
    for name in env.get("VLLM_DISABLED_KERNELS"):
        out.disable((name,), "disabled by VLLM_DISABLED_KERNELS")
    if env.get("VLLM_BATCH_INVARIANT"):
        out.batch_invariant = True
        out.notes.append(explain(env, "VLLM_BATCH_INVARIANT", True,
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
