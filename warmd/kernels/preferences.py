"""Ordered kernel preferences per engine, platform and op family: plain data, first wins.

They mirror what each engine tries in order on each GPU generation; a kernel that is not
supported on the target or cannot implement a layer is skipped with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmd.engines.versions import VersionRange

_FP8_LINEAR_HOPPER = [
    "FlashInferFp8DeepGEMMDynamicBlockScaledKernel", "DeepGemmFp8BlockScaledMMKernel",
    "CutlassFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel",
    "CutlassFP8ScaledMMLinearKernel", "TorchFP8ScaledMMLinearKernel",
]
_FP8_LINEAR_BLACKWELL = [
    "DeepGemmFp8BlockScaledMMKernel", "CutlassFp8BlockScaledMMKernel",
    "TritonFp8BlockScaledMMKernel", "FlashInferFP8ScaledMMLinearKernel",
    "CutlassFP8ScaledMMLinearKernel", "TorchFP8ScaledMMLinearKernel",
]
_FP8_LINEAR_OTHER = [
    "TritonFp8BlockScaledMMKernel", "CutlassFP8ScaledMMLinearKernel",
    "TorchFP8ScaledMMLinearKernel",
]
_MXFP8_LINEAR = ["FlashInferCutlassMxfp8LinearKernel", "EmulatedMxfp8LinearKernel"]
# vLLM 0.34.0 _POSSIBLE_MXFP8_KERNELS (rule vllm-mxfp8-order): CuTe DSL, CUTLASS, Marlin, ...
_VLLM_MXFP8_LINEAR = ["FlashInferCutedslMxfp8LinearKernel", "FlashInferCutlassMxfp8LinearKernel",
                      "MarlinMxfp8LinearKernel", "EmulatedMxfp8LinearKernel"]
_BF16_LINEAR = ["UnquantizedLinearKernel"]
_SAMPLING = ["FlashInferSampler", "TorchSampler"]

PREFERENCES: dict[str, dict[str, dict[str, list[str]]]] = {
    "vllm": {
        "hopper": {
            "linear.fp8": _FP8_LINEAR_HOPPER,
            "linear.mxfp8": _VLLM_MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            # vLLM's moe.fp8 order is decided per launch (warmd.engines.moe_backends, passed
            # as Environment.preference_overrides by make_plan); this row, DeepGEMM first, is
            # its order with VLLM_USE_DEEP_GEMM set explicitly, for plans made without one.
            "moe.fp8": ["TritonOrDeepGemmExperts", "DeepGemmExperts", "TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashAttentionBackend", "FlashInferAttentionBackend",
                              "TritonAttentionBackend"],
            "attention.mla": ["FlashAttnMLABackend", "FlashMLABackend", "FlashInferMLABackend",
                              "TritonMLABackend"],
            "activation": ["VllmCustomOpActivation"],
            "sampling": _SAMPLING,
        },
        "blackwell": {
            "linear.fp8": _FP8_LINEAR_BLACKWELL,
            "linear.mxfp8": _VLLM_MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            "moe.fp8": ["TritonOrDeepGemmExperts", "DeepGemmExperts", "TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashInferAttentionBackend", "TritonAttentionBackend"],
            # rule vllm-attention-priorities: sm100 FLASHINFER_MLA, (TOKENSPEED_MLA: FP8 KV
            # only), CUTLASS_MLA, FLASH_ATTN_MLA (not sm100), FLASHMLA, TRITON_MLA; sm120:
            # TRITON_MLA (FlashInfer MLA refuses it).
            "attention.mla": ["FlashInferMLABackend", "CutlassMLABackend", "FlashMLABackend",
                              "TritonMLABackend"],
            "activation": ["VllmCustomOpActivation"],
            "sampling": _SAMPLING,
        },
        "other": {
            "linear.fp8": _FP8_LINEAR_OTHER,
            "linear.mxfp8": _VLLM_MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            "moe.fp8": ["TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashAttentionBackend", "FlashInferAttentionBackend",
                              "TritonAttentionBackend"],
            "attention.mla": ["TritonMLABackend"],
            "activation": ["VllmCustomOpActivation"],
            "sampling": _SAMPLING,
        },
    },
    "sglang": {
        "hopper": {
            "linear.fp8": ["DeepGemmFp8BlockScaledMMKernel", *_FP8_LINEAR_HOPPER[2:]],
            "linear.mxfp8": _MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            "moe.fp8": ["DeepEPDeepGemmExperts", "TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashAttentionBackend", "FlashInferAttentionBackend",
                              "TritonAttentionBackend"],
            "attention.mla": ["FlashAttnMLABackend", "FlashMLABackend", "FlashInferMLABackend",
                              "TritonMLABackend", "TrtllmMLABackend"],
            "activation": ["SglKernelActivation", "FlashInferActivation", "TorchActivation"],
            "sampling": _SAMPLING,
        },
        "blackwell": {
            "linear.fp8": _FP8_LINEAR_BLACKWELL,
            "linear.mxfp8": _MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            "moe.fp8": ["DeepEPDeepGemmExperts", "TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashInferAttentionBackend", "TritonAttentionBackend"],
            # TrtllmMLABackend: SGLang's trtllm_mla, when named or its DeepSeek-V3 default
            "attention.mla": ["FlashInferMLABackend", "CutlassMLABackend", "TritonMLABackend",
                              "TrtllmMLABackend"],
            "activation": ["SglKernelActivation", "FlashInferActivation", "TorchActivation"],
            "sampling": _SAMPLING,
        },
        "other": {
            "linear.fp8": _FP8_LINEAR_OTHER,
            "linear.mxfp8": _MXFP8_LINEAR,
            "linear.bf16": _BF16_LINEAR,
            "moe.fp8": ["TritonExperts"],
            "moe.bf16": ["TritonExperts"],
            "attention.mha": ["FlashInferAttentionBackend", "TritonAttentionBackend"],
            "attention.mla": ["FlashInferMLABackend", "TritonMLABackend", "TrtllmMLABackend"],
            "activation": ["SglKernelActivation", "FlashInferActivation", "TorchActivation"],
            "sampling": _SAMPLING,
        },
    },
}

ENGINES = tuple(PREFERENCES)

VLLM_ATTENTION_PRIORITIES = "vllm/platforms/cuda.py (_get_backend_priorities)"


@dataclass(frozen=True)
class VersionedPreference:
    """A preference list that holds only for a range of engine releases; PREFERENCES holds the
    newest. Each row cites the engine source it follows."""

    engine: str
    versions: VersionRange
    platform: str
    family: str
    kernels: tuple[str, ...]
    source: str


VERSIONED: tuple[VersionedPreference, ...] = (
    # Blackwell MLA: CUTLASS MLA first until 0.15.x (read: 0.14.0), FlashInfer MLA from
    # 0.16.0 (read: 0.16.0, 0.20.0, 0.27.0, 0.34.0).
    VersionedPreference("vllm", VersionRange(None, (0, 16, 0)), "blackwell", "attention.mla",
                        ("CutlassMLABackend", "FlashInferMLABackend", "FlashMLABackend",
                         "TritonMLABackend"), VLLM_ATTENTION_PRIORITIES),
)


def versioned_preference(engine: str, version, platform: str, family: str):
    """The row for this engine release, or None when PREFERENCES (the newest) holds."""
    return next((row for row in VERSIONED
                 if (row.engine, row.platform, row.family) == (engine, platform, family)
                 and row.versions.contains(version) and row.versions.hi is not None), None)


def platform_of(capability: tuple[int, int]) -> str:
    if capability[0] == 9:
        return "hopper"
    if capability[0] in (10, 11, 12):
        return "blackwell"
    return "other"


def family_of(op: str, quant: str, kind: str | None = None) -> str:
    if op in ("linear", "moe"):
        group = "fp8" if quant in ("fp8_block", "fp8_tensor") else quant
        return f"{op}.{group}"
    if op == "attention":
        return f"attention.{kind or 'mha'}"
    return op
