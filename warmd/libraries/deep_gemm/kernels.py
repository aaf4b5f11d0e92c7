"""DeepGEMM's kernels as the engines dispatch to them, with the GEMM configs each needs."""

from __future__ import annotations

from warmd.engines.moe_backends import BATCHED_ALL2ALL
from warmd.engines.versions import parse_version
from warmd.errors import WarmdInputError
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
from warmd.kernels.registry import TritonExperts
from warmd.models import Layer
from warmd.mvalues import (
    GROUPED_BLOCK_M,
    MSpec,
    clip,
    grouped_m_values,
    vllm_grouped_rows,
    vllm_grouped_warmup_tokens,
)
from warmd.tasks import Task

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


def _deep_gemm_spec(env: Environment) -> dict[str, object]:
    return {"scale_fmt": deep_gemm_scale_format(env)}


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
        return [Task("deep_gemm", "fp8_gemm_nt", layer.n, layer.k, None, tuple(m),
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
    if _vllm_grouped_calls(env):
        return _vllm_contiguous_work(layer, env, mspec, m_range)
    rows = grouped_m_values(mspec, layer.n, env.target.sms, layer.topk or 1,
                            layer.num_groups, *m_range)
    if not rows:
        return []
    return [Task("deep_gemm", "m_grouped_fp8_gemm_nt_contiguous", layer.n, layer.k,
                 layer.num_groups, tuple(rows), spec=_deep_gemm_spec(env))]


# The contiguous grouped layouts of DeepGEMM 2.x: the plain one (an expert id per row) and
# the psum one (each expert's end row; GemmType MGroupedContiguousWithPsumLayout, another
# kernel.cu, so another cache entry). The task's spec names the layout and the
# alignment (BLOCK_M cap) the engine sets around its calls; the executor calls them so.
PLAIN, PSUM = "contiguous", "psum"

# DeepGEMM's per-call theoretical alignment (get_theoretical_mk_alignment_for_contiguous_
# layout) by release and GPU generation, read from DeepGEMM 2.8.1's extension as vLLM
# 0.34.0 ships it (the function's machine code: 256 on sm100, else 128, whatever the
# expected M). vLLM shrinks its 128-row alignment to it only when smaller.
# sgl-deep-gemm 0.2.x is not in it (128 everywhere is assumed): its extension was read, not
# run, and upstream's source of that function shrinks the alignment with the expected M on
# sm100/sm120 (HeuristicsRuntime::get_theoretical_mk_alignment_for_contiguous_layout), which
# warmd does not model for vLLM with an external 0.2.x on those GPUs.
THEORETICAL_ALIGNMENT: dict[tuple[int, int], dict[int, int]] = {(2, 8): {10: 256}}


def _deep_gemm_release(env: Environment) -> tuple[int, int] | None:
    """The (major, minor) of the DeepGEMM the engine imports; None when unknown (a plan for
    another machine: vLLM's vendored copy is then taken)."""
    version = env.library("deep_gemm").version
    if not version:
        return None
    try:
        major, minor, _ = parse_version(version)
    except WarmdInputError:
        return None
    return major, minor


def _vllm_grouped_calls(env: Environment) -> bool:
    """vLLM >= 0.33.0 (rules vllm-moe-psum-layout, vllm-grouped-warmup): its serving and its
    warmup call the grouped GEMM in an alignment scope, serving with the psum layout where
    it can: with DeepGEMM 2.x and every sgl-deep-gemm release (0.1.0 on: their
    m_grouped_fp8_gemm_nt_contiguous takes use_psum_layout). DeepGEMM 1.x has no psum
    layout: warmd keeps its plain calls."""
    from warmd.engines.rules import BY_ID

    release = _deep_gemm_release(env)
    psum = release is None or release[0] != 1
    return (env.engine == "vllm" and psum
            and BY_ID["vllm-moe-psum-layout"].versions.contains(env.engine_version))


def vllm_grouped_alignment(env: Environment) -> int:
    """The per-call alignment vLLM's compute_aligned_M_and_alignment settles on (rule
    vllm-grouped-alignment): 128, or DeepGEMM's theoretical alignment when smaller."""
    release = _deep_gemm_release(env) or (2, 8)  # vLLM's vendored DeepGEMM 2.8.1
    theoretical = THEORETICAL_ALIGNMENT.get(release, {}).get(env.target.capability[0],
                                                            GROUPED_BLOCK_M)
    return min(GROUPED_BLOCK_M, theoretical)


def vllm_serves_psum(env: Environment) -> bool:
    """DeepGemmExperts.apply's use_psum_layout for FP8 block experts (SiLU, the activation
    of every MoE model warmd reads): sm90, and sm100 with UE8M0 scales (E8M0 on)."""
    major = env.target.capability[0]
    return major == 9 or (major == 10 and env.deep_gemm_e8m0)


# vLLM all2all backends whose dispatch hands the experts their token counts on the CPU
# (ExpertTokensMetadata.make_from_list): every expert's rows are then padded exactly, so
# any multiple of the alignment up to the worst case can reach the GEMM.
_COUNTS_ON_CPU = ("deepep_high_throughput", "deepep_v2")


def _vllm_serving_rows(layer: Layer, env: Environment, mspec: MSpec, m_range: MRange,
                       alignment: int) -> list[int]:
    """Every row count vLLM's serving can give the grouped GEMM for the token counts the
    layer routes to DeepGEMM (compute_aligned_M_and_alignment)."""
    tokens = mspec.moe_tokens or mspec.max_tokens
    lo, hi = m_range[0], tokens if m_range[1] is None else min(m_range[1], tokens)
    if hi < lo:
        return []
    topk, groups = layer.topk or 1, layer.num_groups or 1
    if env.moe_a2a_backend in _COUNTS_ON_CPU:
        last = vllm_grouped_rows(hi, topk, groups, alignment)
        return list(range(alignment, last + 1, alignment))
    counts = clip(list(mspec.explicit), lo, hi) if mspec.explicit else range(lo, hi + 1)
    return sorted({vllm_grouped_rows(t, topk, groups, alignment) for t in counts})


def _vllm_contiguous_work(layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
    """What vLLM >= 0.33.0 loads for one grouped GEMM: its warmup's plain-layout calls
    (every token count of its set, the Triton wrapper's small M included: the warmup calls
    DeepGEMM directly) and its serving's calls, in the psum layout where it serves so."""
    alignment = vllm_grouped_alignment(env)
    topk, groups = layer.topk or 1, layer.num_groups or 1
    widest = max(2 * layer.param["intermediate"], layer.param["hidden"])
    warm = {vllm_grouped_rows(t, topk, groups, alignment)
            for t in vllm_grouped_warmup_tokens(mspec, widest, env.target.sms)}
    serve = set(_vllm_serving_rows(layer, env, mspec, m_range, alignment))
    layouts = {PLAIN: warm, PSUM: serve} if vllm_serves_psum(env) else {PLAIN: warm | serve}
    return [Task("deep_gemm", "m_grouped_fp8_gemm_nt_contiguous", layer.n, layer.k,
                 layer.num_groups, tuple(sorted(rows)),
                 spec={**_deep_gemm_spec(env), "layout": layout, "alignment": alignment})
            for layout, rows in layouts.items() if rows]


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


def _masked_task(layer: Layer, env: Environment, expected_m: list[int]) -> Task:
    """DeepGEMM's masked grouped GEMM at each expected M (the M values of its task)."""
    return Task("deep_gemm", "m_grouped_fp8_gemm_nt_masked", layer.n, layer.k,
                layer.num_groups, tuple(expected_m), spec=_deep_gemm_spec(env))


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
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        work = _contiguous_work(layer, env, mspec, m_range)
        expected = clip(mspec.values(layer.n, env.target.sms), *m_range)
        if expected:
            work.append(_masked_task(layer, env, expected))
        return work


class DeepGemmRunnerExperts(DeepEPDeepGemmExperts):
    """SGLang's --moe-runner-backend deep_gemm without DeepEP (rule sglang-deep-gemm-runner):
    the standard dispatcher feeds the DeepGEMM runner (moe_runner/deep_gemm.py
    pre_permute_standard_to_deep_gemm), the contiguous grouped GEMM and, under CUDA graphs or
    the masked standard layout, the masked one: the DeepEP path's GEMMs."""

    name = "DeepGemmRunnerExperts"

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        return DeepGemmExperts.is_supported.__func__(cls, env)


def batched_expected_m(layer: Layer, mspec: MSpec) -> list[int]:
    """The expected_m values vLLM's BatchedDeepGemmExperts passes the masked grouped GEMM
    (estimate_expected_m, rule vllm-batched-deepgemm): the tokens of every DP rank x topk /
    global experts, rounded up to 16, between 16 and the per-expert capacity
    (max_num_batched_tokens x EP ranks); the capacity itself where no DP metadata is there."""
    budget = mspec.max_tokens
    total = mspec.moe_tokens or budget  # DP x budget
    ranks = int(layer.param.get("ep") or 1)
    experts = (layer.num_groups or 1) * ranks
    capacity = budget * ranks
    top = min(capacity, max(16, -(-(total * (layer.topk or 1) // experts) // 16) * 16))
    return sorted({*range(16, top + 1, 16), capacity})


class BatchedDeepGemmExperts(Kernel):
    """vLLM's BATCHED_DEEPGEMM (fused_moe/experts/batched_deep_gemm_moe.py): DeepGEMM's masked
    grouped GEMM for the batched format of the DeepEP low-latency and NIXL EP all2all. vLLM's
    own warmup does not visit it (deep_gemm_warmup.py warms DeepGemmExperts and
    TritonOrDeepGemmExperts only): its kernels compile in traffic unless warmd warms them."""

    name = "BatchedDeepGemmExperts"
    op = "moe"
    library = "deep_gemm"
    capabilities = DEEP_GEMM_CAPABILITIES
    schemes = ("fp8_block",)

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        if env.moe_a2a_backend not in BATCHED_ALL2ALL:
            return False, ("runs the batched format only (vLLM --all2all-backend "
                           "deepep_low_latency or nixl_ep, with expert parallel and DP > 1)")
        return super().is_supported(env)

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        return fp8_block_128(layer)

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec, m_range: MRange):
        return [_masked_task(layer, env, batched_expected_m(layer, mspec))]


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
    DeepGemmRunnerExperts, TritonOrDeepGemmExperts, BatchedDeepGemmExperts,
)
