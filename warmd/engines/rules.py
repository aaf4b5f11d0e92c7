"""The engine rules that changed up to vLLM 0.34.0 and SGLang 0.5.23, as data rows keyed by
release range, each citing the released file and the symbol (function, class, method or
table) it follows. docs/selection.md lists every row; scripts/tools/engine_drift.py digests each
cited symbol per followed release (warmd/engines/data/rule-digests.json) and reports the rows
whose source a new release changed. The functions below apply the rows that are numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from warmd.engines.versions import Version, VersionRange
from warmd.targets import Target


@dataclass(frozen=True)
class Rule:
    id: str
    engine: str  # vllm | sglang
    versions: VersionRange
    file: str  # as in the release's wheel (SGLang: its repository path, python/sglang/...)
    symbol: str  # dotted: function, Class, Class.method, or a module-level table
    text: str

    def cite(self) -> str:
        return f"{self.file} {self.symbol}"


_V033 = VersionRange((0, 33, 0), None)
_V034 = VersionRange((0, 34, 0), None)
_ALL = VersionRange()
_WARMUP = "vllm/model_executor/warmup/deep_gemm_warmup.py"
_ARG_UTILS = "vllm/engine/arg_utils.py"
_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_LINEAR = "vllm/model_executor/kernels/linear/__init__.py"
_CUDA = "vllm/platforms/cuda.py"
_SG_MEMORY = "python/sglang/srt/arg_groups/memory_hook.py"
_DG_UTILS = "vllm/model_executor/layers/fused_moe/deep_gemm_utils.py"
_DG_MOE = "vllm/model_executor/layers/fused_moe/experts/deep_gemm_moe.py"
_MOE_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/fp8.py"
_TRITON_MOE = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
_SCALED_MM = "vllm/model_executor/kernels/linear/scaled_mm/"
_SG_FP8 = "python/sglang/srt/layers/quantization/fp8.py"
_SG_FP8_UTILS = "python/sglang/srt/layers/quantization/fp8_utils.py"

RULES: tuple[Rule, ...] = (
    Rule("vllm-relax-block-m", "vllm", _V034, _WARMUP, "_generate_optimal_warmup_m_values",
         "relax M set: BLOCK_M candidates 16..256 in steps of 16 (DeepGEMM 2.x layouts); "
         "before 0.34.0: 64, 128, 256"),
    Rule("vllm-wrapper-warmup", "vllm", _V033, _WARMUP, "_deep_gemm_linear_data",
         "the warmup visits every layer whose DeepGEMM kernel stamped itself "
         "deep_gemm_warmup_provider, the FlashInfer/DeepGEMM wrapper's too: DeepGEMM is "
         "warmed at every M of the set, M < 32 included"),
    Rule("vllm-grouped-m", "vllm", _V033, _WARMUP, "_get_grouped_gemm_params",
         "grouped GEMM warmup: the relax set over DP x max_num_batched_tokens through "
         "compute_aligned_M_and_alignment; no VLLM_FUSED_MOE_CHUNK_SIZE cap (gone from envs.py)"),
    Rule("vllm-grouped-alignment", "vllm", _V033, _DG_UTILS, "compute_aligned_M_and_alignment",
         "rows = T x topk + min(T x topk, local experts) x (A - 1), rounded up to A; A is 128, "
         "or DeepGEMM's theoretical alignment when smaller (DeepGEMM 2.8.1: 256 on sm100, 128 "
         "elsewhere, so 128 everywhere)"),
    Rule("vllm-moe-psum-layout", "vllm", _V033, _DG_MOE, "DeepGemmExperts.apply",
         "serving calls the grouped GEMM with use_psum_layout=True (another DeepGEMM kernel: "
         "GemmType MGroupedContiguousWithPsumLayout) on sm90, and on sm100 with UE8M0 scales, "
         "inside mk_alignment_scope(A); every row count of every token count T"),
    Rule("vllm-grouped-warmup", "vllm", _V033, _WARMUP,
         "_deepgemm_grouped_fp8_gemm_nt_contiguous_warmup",
         "the warmup calls the grouped GEMM in the plain contiguous layout (no psum) inside "
         "mk_alignment_scope(A), for both GEMMs at the rows of its relax token set"),
    Rule("vllm-linear-backend", "vllm", _V034, _LINEAR, "_resolve_backend_kernels",
         "--linear-backend keeps only its kernels (_LINEAR_BACKEND_KERNEL_MAP) in each linear "
         "kernel list that has one; a list without one stays whole"),
    Rule("vllm-cutedsl-router-gemm", "vllm", _V034,
         "vllm/model_executor/layers/fused_moe/router/gate_linear.py", "GateLinear.__init__",
         "the MoE router GEMM runs CuTe-DSL ll_bf16/ll_fp32w kernels (dot product up to M 4, "
         "split-K above) on sm90/sm100 with CuTe DSL when the router computes in FP32; "
         "compiled by the engine"),
    Rule("vllm-moe-activation-format", "vllm", _V033,
         "vllm/model_executor/layers/fused_moe/config.py", "FusedMoEConfig.activation_format",
         "the DeepEP low-latency and NIXL EP all2all (expert parallel with DP > 1) hand the "
         "experts the batched format: only batched kernels (BATCHED_DEEPGEMM, BATCHED_TRITON)"),
    Rule("vllm-batched-deepgemm", "vllm", _V033,
         "vllm/model_executor/layers/fused_moe/experts/batched_deep_gemm_moe.py",
         "BatchedDeepGemmExperts.estimate_expected_m",
         "masked grouped GEMM at expected_m = DP tokens x topk / global experts rounded up to "
         "16, in [16, max_num_batched_tokens x EP]; that capacity without DP metadata; not "
         "in vLLM's own warmup"),
    Rule("vllm-fi-moe-static-tensor", "vllm", _V033,
         "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py",
         "FlashInferExperts._supports_quant_scheme",
         "FlashInfer CUTLASS fused MoE takes per-tensor FP8 with static activation scales "
         "from sm90 (block FP8 on sm90 only); the TRT-LLM-gen one (sm100) takes both"),
    Rule("vllm-fp8-activation-scheme", "vllm", _ALL,
         "vllm/model_executor/layers/quantization/fp8.py", "Fp8Config.__init__",
         "activation_scheme static or dynamic (else refused); block FP8 only dynamic; static "
         "per-tensor scales make kFp8StaticTensorSym activations"),
    Rule("vllm-token-budget", "vllm", _V033, _ARG_UTILS, "EngineArgs.get_batch_defaults",
         "vllm serve's max_num_batched_tokens: 16384 on GPUs with >= 160 GiB, 8192 from "
         "70 GiB (not A100, not GB10), else 2048"),
    Rule("vllm-token-budget-mode", "vllm", _V033, _ARG_UTILS,
         "EngineArgs._set_default_max_num_seqs_and_batched_tokens_args",
         "--performance-mode throughput doubles the default budget; DeepEP low-latency / "
         "NIXL EP all2all with EP and DP > 1 (batched DP MoE) sets it to 256"),
    Rule("vllm-triton-moe-configs", "vllm", _ALL, _FUSED_MOE, "_get_configured_moe_config",
         "Triton fused MoE: the tuned config of the closest batch size in "
         "configs/E=..,N=..,device_name=..,dtype=..,block_shape=...json"),
    Rule("vllm-triton-moe-default", "vllm", _ALL, _FUSED_MOE, "get_default_config",
         "Triton fused MoE without a tuned table, block FP8: configs change at M 4, 8, 16, 64"),
    Rule("vllm-mxfp8-order", "vllm", _V034, _LINEAR, "_POSSIBLE_MXFP8_KERNELS",
         "MXFP8 linear: FlashInfer CuTe-DSL first, then FlashInfer CUTLASS, Marlin, ..., "
         "emulation"),
    Rule("vllm-fp8-block-order", "vllm", _V034, _LINEAR, "_POSSIBLE_FP8_BLOCK_KERNELS",
         "block FP8 linear: FlashInfer/DeepGEMM wrapper, DeepGEMM, CUTLASS, ..., Triton"),
    Rule("vllm-disabled-kernels", "vllm", _V034, _LINEAR, "init_mxfp8_linear_kernel",
         "VLLM_DISABLED_KERNELS is checked against the selected class's own name only: a "
         "wrapper's branch named there does not disable the wrapper"),
    Rule("vllm-attention-priorities", "vllm", _V034, _CUDA, "_get_backend_priorities",
         "attention backend order per GPU generation (MLA on sm100: FlashInfer MLA through "
         "TRT-LLM-gen first)"),
    Rule("sglang-chunked-prefill", "sglang", _ALL, _SG_MEMORY, "handle_gpu_memory_settings",
         "--chunked-prefill-size default by GPU memory: < 20 GiB 2048, < 60 GiB 4096, "
         "< 160 GiB 8192, else 16384 (unknown: 4096)"),
    # Issue 27's audit: each read against the 0.34.0 / 0.5.23 source.
    Rule("vllm-fp8-moe-block-refine", "vllm", _V033, _MOE_ORACLE,
         "refine_fp8_moe_block_shape",
         "block-FP8 MoE whose intermediate size per TP rank is not a whole number of weight "
         "blocks: the scales are refined to [r, r], r = gcd(block_n, block_k, intermediate "
         "per rank, hidden) when r >= 32 (else the engine refuses the checkpoint); only "
         "Triton MoE takes a non-128x128 block (TritonExperts._supports_quant_scheme), with "
         "get_default_config (no tuned table has the refined block). SGLang refuses"),
    Rule("vllm-cutlass-block-fp8", "vllm", _V034, _SCALED_MM + "cutlass.py",
         "CutlassFp8BlockScaledMMKernel.can_implement",
         "CUTLASS block-FP8 linear: dynamic (1, 128) activation groups, no N or K condition "
         "(the kernel pads N); SGLang's cutlass_w8a8_block_fp8_linear_with_fallback keeps "
         "N % 128 and K % 128"),
    Rule("vllm-triton-block-fp8-linear", "vllm", _ALL, _SCALED_MM + "triton.py",
         "TritonFp8BlockScaledMMKernel",
         "Triton block-FP8 linear (--linear-backend triton, and the last fallback): "
         "w8a8_triton_block_scaled_mm compiles a kernel per config at first use"),
    Rule("vllm-triton-moe-down-tma", "vllm", _V034, _TRITON_MOE, "TritonExperts.apply",
         "128x128 block FP8: the closest batch size of the `<table>_down` config table "
         "(get_moe_configs(down_moe=True)) with USE_TMA runs the down GEMM as a TMA kernel "
         "of its own (sm90, DeepGEMM E8M0 scales, hidden >= 4096)"),
    Rule("vllm-ll-bf16-router-warmup", "vllm", _V033,
         "vllm/model_executor/warmup/kernel_warmup.py", "_warmup_ll_bf16_router_gemm",
         "kernel_warmup compiles the CuTe-DSL ll_bf16 router GEMM at M 1..16 for every bf16 "
         "GateLinear with K % 8 on sm90 and later, whatever the router computes in"),
    Rule("vllm-fa4-mla-prefill", "vllm", _V034, "vllm/platforms/interface.py",
         "Platform.get_mla_prefill_backend_cls",
         "MLA prefill on sm100: FLASH_ATTN (FA4, CuTe DSL, compiled by vLLM's JIT warmup: "
         "v1/attention/backends/mla/prefill/flash_attn.py FA4MLAPrefillKernel) first, "
         "TRTLLM_RAGGED first only for qk_nope 192 / rope 64 / v 256"),
    Rule("sglang-fp8-moe-runner", "sglang", _ALL, _SG_FP8, "Fp8MoEMethod.create_moe_runner",
         "FP8 MoE runner: auto is deep_gemm when DeepGEMM MoE is enabled, else Triton; "
         "flashinfer_cutlass and flashinfer_cutedsl have no FP8 MoE path: Triton"),
    Rule("sglang-deep-gemm-runner", "sglang", _ALL,
         "python/sglang/srt/layers/moe/moe_runner/deep_gemm.py",
         "pre_permute_standard_to_deep_gemm",
         "--moe-runner-backend deep_gemm without DeepEP: the standard dispatcher feeds the "
         "DeepGEMM runner, contiguous grouped GEMM (masked under CUDA graphs)"),
    Rule("sglang-fp8-gemm-backend", "sglang", _ALL, _SG_FP8_UTILS,
         "_dispatch_explicit_backend",
         "--fp8-gemm-backend: triton runs triton_w8a8_block_fp8_linear (no DeepGEMM linear), "
         "deep_gemm DeepGEMM, cutlass CUTLASS (sm120 only)"),
    Rule("sglang-cutlass-block-fp8", "sglang", _ALL, _SG_FP8_UTILS,
         "cutlass_w8a8_block_fp8_linear_with_fallback",
         "CUTLASS block FP8 only for N % 128 and K % 128, else Triton"),
    Rule("sglang-deepseek-trtllm-mla", "sglang", _ALL,
         "python/sglang/srt/arg_groups/model_overrides/deepseek_v2.py",
         "_deepseek_family_overrides",
         "DeepSeek-V3 family (not DSA) on sm100 with no attention backend given: "
         "--attention-backend trtllm_mla (FlashInfer TRT-LLM-gen MLA, no batch_mla module)"),
    Rule("sglang-triton-moe-configs", "sglang", _ALL,
         "python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
         "get_moe_configs",
         "SGLang's own Triton MoE tables: configs/triton_<version>/ of the Triton it imports, "
         "else the newest directory with the table; device name unfolded, block as [128, 128]"),
    # Rules older than this wave, cited so that a release changing them is found too.
    Rule("vllm-cli-flags", "vllm", _ALL, _ARG_UTILS, "EngineArgs.add_cli_args",
         "the serve flags (warmd/engines/data/vllm-<version>.json, scripts/tools/engine_flags.py)"),
    Rule("vllm-cli-rewrite", "vllm", _ALL, "vllm/utils/argparse_utils.py",
         "FlexibleArgumentParser.parse_args",
         "--model moved to the positional, underscores to dashes, -O, dotted JSON arguments"),
    Rule("vllm-envs", "vllm", _ALL, "vllm/envs.py", "environment_variables",
         "the engine variables warmd reads and their defaults (warmd/engines/environment.py)"),
    Rule("vllm-fp8-moe-oracle", "vllm", _ALL,
         "vllm/model_executor/layers/fused_moe/oracle/fp8.py", "_get_priority_backends",
         "FP8 MoE backend order (warmd/engines/moe_backends.py)"),
    Rule("vllm-deepgemm-linear-shape", "vllm", _ALL, "vllm/utils/deep_gemm.py",
         "should_use_deepgemm_for_fp8_linear", "block FP8 linear on DeepGEMM when N % 64 and "
         "K % 128"),
    Rule("vllm-deepgemm-import", "vllm", _ALL, "vllm/utils/deep_gemm.py", "_import_deep_gemm",
         "the DeepGEMM vLLM imports: an external deep_gemm, else vllm.third_party.deep_gemm"),
    Rule("vllm-flashinfer-mla-sm100", "vllm", _V033,
         "vllm/v1/attention/backends/mla/flashinfer_mla.py",
         "FlashInferMLABackend.supports_compute_capability",
         "FLASHINFER_MLA runs on sm100 only (TRT-LLM-gen decode); refused on Hopper"),
    Rule("vllm-trtllm-attention", "vllm", _V033, "vllm/utils/flashinfer.py",
         "supports_trtllm_attention",
         "FlashInfer MHA runs TRT-LLM-gen prefill and decode on the sm100 family, decode on "
         "sm120"),
    Rule("vllm-deepgemm-sm120", "vllm", _V034, _CUDA, "CudaPlatformBase.support_deep_gemm",
         "DeepGEMM on sm90, the sm100 family and the sm120 family (RTX Pro 6000)"),
    Rule("vllm-mxfp8-cutedsl", "vllm", _V034,
         "vllm/model_executor/kernels/linear/mxfp8/flashinfer.py",
         "FlashInferCutedslMxfp8LinearKernel",
         "the CuTe-DSL MXFP8 GEMM: sm100/sm103 with FlashInfer's CuTe-DSL module"),
    Rule("sglang-cli-flags", "sglang", _ALL, "python/sglang/srt/server_args.py",
         "ServerArgs.add_cli_args",
         "the launch flags (warmd/engines/data/sglang-<version>.json)"),
    Rule("sglang-deepgemm-precompile", "sglang", _ALL,
         "python/sglang/srt/layers/deep_gemm_wrapper/compile_utils.py",
         "update_deep_gemm_config", "DeepGEMM precompile M range and fast set"),
    Rule("sglang-default-attention", "sglang", _ALL,
         "python/sglang/srt/arg_groups/model_override_base.py", "get_default_attn_backend",
         "default attention backend per GPU"),
    Rule("sglang-moe-runners", "sglang", _ALL, "python/sglang/srt/arg_groups/choices.py",
         "MOE_RUNNER_BACKEND_CHOICES", "--moe-runner-backend values"),
)
BY_ID = {rule.id: rule for rule in RULES}

GIB = 1024  # MiB


def vllm_default_max_tokens(target: Target, version: Version | None,
                            performance_mode: str | None = None,
                            batched_dp_moe: bool = False) -> tuple[int, str]:
    """vLLM's default max_num_batched_tokens for `vllm serve` (OPENAI_API_SERVER) on the
    target, and the note saying why."""
    budget, mode = BY_ID["vllm-token-budget"], BY_ID["vllm-token-budget-mode"]
    if not budget.versions.contains(version):
        return 8192, "max_num_batched_tokens defaults to 8192 (warmd's rule before 0.33.0)"
    if batched_dp_moe:
        return 256, (f"batched DP MoE (DeepEP low latency, EP, DP > 1): max_num_batched_tokens "
                     f"defaults to 256 ({mode.cite()})")
    memory = target.memory_mib
    name = target.name.lower()
    if memory is None:
        tokens, why = 8192, "target memory unknown: taken as 70-160 GiB"
    elif memory >= 160 * GIB:
        tokens, why = 16384, f"{memory // GIB} GiB >= 160 GiB"
    elif memory >= 70 * GIB and "a100" not in name and target.capability != (12, 1):
        tokens, why = 8192, f"{memory // GIB} GiB, 70-160 GiB"
    else:
        tokens, why = 2048, f"{memory // GIB} GiB" + (", A100" if "a100" in name else "")
    note = f"max_num_batched_tokens defaults to {tokens} on {target.name} ({why}; " \
           f"{budget.cite()})"
    if performance_mode == "throughput":
        tokens *= 2
        note += f"; --performance-mode throughput doubles it to {tokens} ({mode.cite()})"
    return tokens, note


def sglang_default_chunked_prefill(target: Target) -> tuple[int, str]:
    """SGLang's --chunked-prefill-size default on the target's GPU memory."""
    rule = BY_ID["sglang-chunked-prefill"]
    memory = target.memory_mib
    if memory is None:
        size = 4096
    elif memory < 20 * GIB:
        size = 2048
    elif memory < 60 * GIB:
        size = 4096
    elif memory < 160 * GIB:
        size = 8192
    else:
        size = 16384
    shown = "unknown memory" if memory is None else f"{memory // GIB} GiB"
    return size, f"--chunked-prefill-size defaults to {size} on {target.name} ({shown}; " \
                 f"{rule.cite()})"


def vllm_refined_moe_block(block: tuple[int, int], per_rank: int, hidden: int,
                           moe_tp: int) -> tuple[int, int] | None:
    """refine_fp8_moe_block_shape (rule vllm-fp8-moe-block-refine): the block vLLM refines
    a TP-sharded FP8 MoE's scales to, or None when the shard fits the block or cannot be
    refined (the engine then refuses the checkpoint)."""
    block_n, block_k = block
    if per_rank % block_n == 0 and (moe_tp == 1 or per_rank % block_k == 0):
        return None
    refine = math.gcd(block_n, block_k, per_rank, hidden)
    return (refine, refine) if refine >= 32 else None


def vllm_relax_block_ms(version: Version | None) -> tuple[int, ...]:
    """The BLOCK_M candidates of vLLM's relax M set for the release."""
    if BY_ID["vllm-relax-block-m"].versions.contains(version):
        return tuple(range(16, 257, 16))
    return (64, 128, 256)
