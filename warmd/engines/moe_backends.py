"""Which FP8 MoE backend the engine picks: vLLM's FP8 MoE oracle per release, and SGLang's
--moe-runner-backend, as data plus one function per engine.

The result is an ordered list of warmd kernel names for the `moe.fp8` family (the selection
loop in warmd.kernels.selection then checks capability, library and layer in that order, with
every rejection's reason), whether the engine forces that list (it then refuses to start when
no entry fits: so does warmd), and notes for the plan.

vLLM releases, read from each release's source distribution (0.15.x has none; it is taken
to follow 0.14.0):
- < 0.12.0 (read: 0.11.0), vllm/model_executor/layers/quantization/fp8.py (Fp8MoEMethod):
  FlashInfer only with VLLM_USE_FLASHINFER_MOE_FP8=1 (VLLM_FLASHINFER_MOE_BACKEND throughput,
  the default: CUTLASS; latency: TRT-LLM), else DeepGEMM for block FP8 (VLLM_USE_DEEP_GEMM),
  else CUTLASS block-scaled grouped GEMM on sm100, else Triton.
- 0.12.0 - 0.13.x (read: 0.12.0, 0.13.0), the same file, get_fp8_moe_backend: FlashInfer still
  opt-in, on sm90/sm100 only (latency, now the default, means CUTLASS off sm100); DeepGEMM off
  by default when the MoE's TP size is >= 8 unless VLLM_MOE_USE_DEEP_GEMM is set; CUTLASS
  block-scaled grouped GEMM on sm100; Triton.
- 0.14.0 - 0.15.x (read: 0.14.0), fused_moe/oracle/fp8.py select_fp8_moe_backend: the same
  without the CUTLASS block-scaled grouped GEMM.
- 0.16.x (read: 0.16.0): a priority list FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, DEEPGEMM,
  TRITON, each kernel's is_supported_config deciding; VLLM_USE_FLASHINFER_MOE_FP8 set
  explicitly removes (0) or forces (1) FlashInfer, VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM
  set explicitly remove (0) or force (1) DeepGEMM.
- >= 0.17.0 (read: 0.17.0, 0.18.0, 0.19.0, 0.20.0, 0.23.0, 0.24.0, 0.25.0, 0.27.0, 0.34.0):
  the same list, and on Hopper for 128x128 block FP8 Triton goes first without expert
  parallel and FlashInfer CUTLASS first with it; --moe-backend forces one backend.
- >= 0.24.0 (0.23.0 still reads them): VLLM_USE_FLASHINFER_MOE_FP8 and
  VLLM_FLASHINFER_MOE_BACKEND are no longer read (--moe-backend replaces them).
- the batched format (DeepEP low-latency / NIXL EP all2all with EP and DP > 1, >= 0.16.0):
  BATCHED_DEEPGEMM, then BATCHED_TRITON.
Not modelled: LoRA (Triton), humming, batched CUTLASS (compressed-tensors), Marlin/ROCm, and
0.34.0's DeepGEMM opt-out for some model types on Blackwell (should_auto_disable_deep_gemm).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.engines.environment import EngineEnv
from warmd.engines.versions import Version, VersionRange
from warmd.errors import WarmdInputError

VLLM_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/fp8.py"
VLLM_LEGACY = "vllm/model_executor/layers/quantization/fp8.py"
SGLANG_SERVER_ARGS = "python/sglang/srt/server_args.py"

# vLLM's Fp8MoeBackend -> the warmd kernels that stand for it, in the order tried. DEEPGEMM is
# vLLM's TritonOrDeepGemmExperts: every M on DeepGEMM with E8M0 scales (DeepGemmExperts),
# else Triton below 128 rows (TritonOrDeepGemmExperts; see warmd/libraries/deep_gemm).
VLLM_BACKEND_KERNELS: dict[str, tuple[str, ...]] = {
    "FLASHINFER_TRTLLM": ("TrtLlmFp8Experts",),
    "FLASHINFER_CUTLASS": ("FlashInferExperts",),
    "DEEPGEMM": ("TritonOrDeepGemmExperts", "DeepGemmExperts"),
    "CUTLASS_BLOCK_SCALED_GROUPED_GEMM": ("CutlassBlockScaledGroupedGemmExperts",),
    "TRITON": ("TritonExperts",),
    "BATCHED_DEEPGEMM": ("BatchedDeepGemmExperts",),
    "BATCHED_TRITON": ("BatchedTritonExperts",),
}
# The batched activation format (DeepEP low latency, NIXL EP) rules out every standard-format
# kernel (oracle/base.py is_supported_config: activation_format().is_superset): what is left of
# the priority list (humming is a separate package, batched CUTLASS is off for FP8 checkpoints:
# allow_vllm_cutlass=False in quantization/fp8.py), and the batched twin of a named backend.
_BATCHED_ORDER = ("BATCHED_DEEPGEMM", "BATCHED_TRITON")
# vLLM's all2all backends that hand the experts the batched (masked) activation format
# (FusedMoEConfig.activation_format, with expert parallel and DP > 1; rule
# vllm-moe-activation-format).
BATCHED_ALL2ALL = ("deepep_low_latency", "nixl_ep")
_BATCHED_TWIN = {"DEEPGEMM": "BATCHED_DEEPGEMM", "TRITON": "BATCHED_TRITON"}
# vLLM's --moe-backend values that name an FP8 MoE backend (map_fp8_backend in the oracle).
VLLM_MOE_BACKEND_FLAG = {"triton": "TRITON", "deep_gemm": "DEEPGEMM",
                         "flashinfer_trtllm": "FLASHINFER_TRTLLM",
                         "flashinfer_cutlass": "FLASHINFER_CUTLASS"}
# SGLang's --moe-runner-backend -> the warmd kernels its FP8 MoE runs (Fp8MoEMethod.
# create_moe_runner, rule sglang-fp8-moe-runner): deep_gemm through DeepEP, else through the
# standard dispatcher (rule sglang-deep-gemm-runner); flashinfer_cutlass and
# flashinfer_cutedsl have no FP8 MoE path and run Triton.
SGLANG_RUNNER_KERNELS = {"triton": ("TritonExperts",),
                         "deep_gemm": ("DeepEPDeepGemmExperts", "DeepGemmRunnerExperts"),
                         "flashinfer_trtllm": ("TrtLlmFp8Experts",),
                         "flashinfer_cutlass": ("TritonExperts",),
                         "flashinfer_cutedsl": ("TritonExperts",)}
_SGLANG_FP8_MOE = "python/sglang/srt/layers/quantization/fp8.py"


@dataclass(frozen=True)
class OracleRow:
    """How one range of vLLM releases picks its FP8 MoE backend."""

    versions: VersionRange
    source: str
    style: str  # legacy | explicit | priority
    order: tuple[str, ...]
    hopper_block_rule: bool = False  # Triton first under TP, FlashInfer CUTLASS under EP
    moe_backend_flag: bool = False  # --moe-backend exists
    flashinfer_env: bool = True  # VLLM_USE_FLASHINFER_MOE_FP8 is read


_PRIORITY = ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "DEEPGEMM", "TRITON")
ORACLE_ROWS: tuple[OracleRow, ...] = (
    OracleRow(VersionRange(None, (0, 12, 0)), VLLM_LEGACY, "legacy",
              ("DEEPGEMM", "CUTLASS_BLOCK_SCALED_GROUPED_GEMM", "TRITON")),
    OracleRow(VersionRange((0, 12, 0), (0, 14, 0)), VLLM_LEGACY, "explicit",
              ("DEEPGEMM", "CUTLASS_BLOCK_SCALED_GROUPED_GEMM", "TRITON")),
    OracleRow(VersionRange((0, 14, 0), (0, 16, 0)), VLLM_ORACLE, "explicit",
              ("DEEPGEMM", "TRITON")),
    OracleRow(VersionRange((0, 16, 0), (0, 17, 0)), VLLM_ORACLE, "priority", _PRIORITY),
    OracleRow(VersionRange((0, 17, 0), (0, 24, 0)), VLLM_ORACLE, "priority", _PRIORITY,
              hopper_block_rule=True, moe_backend_flag=True),
    OracleRow(VersionRange((0, 24, 0), None), VLLM_ORACLE, "priority", _PRIORITY,
              hopper_block_rule=True, moe_backend_flag=True, flashinfer_env=False),
)


@dataclass(frozen=True)
class MoeChoice:
    """The moe.fp8 preference for one plan."""

    kernels: tuple[str, ...]
    forced_by: str | None = None  # the flag or variable that forces it (the engine refuses else)
    notes: tuple[str, ...] = field(default=())


def oracle_row(version: Version | None) -> OracleRow:
    return next(row for row in ORACLE_ROWS if row.versions.contains(version))


def _kernels(backends) -> tuple[str, ...]:
    return tuple(name for backend in backends for name in VLLM_BACKEND_KERNELS[backend])


def _flashinfer_backend(env: EngineEnv, capability: tuple[int, int]) -> str:
    """get_flashinfer_moe_backend: latency is TRT-LLM on sm100 only, CUTLASS elsewhere."""
    value = env.get("VLLM_FLASHINFER_MOE_BACKEND")
    if value == "latency" and capability[0] == 10:
        return "FLASHINFER_TRTLLM"
    return "FLASHINFER_CUTLASS"


def _describe(env: EngineEnv, name: str) -> str:
    return f"{name}={env.raw(name)}"


def vllm_fp8_moe(env: EngineEnv, capability: tuple[int, int], block: bool, ep: int,
                 moe_tp: int, moe_backend: str | None, batched: bool = False) -> MoeChoice:
    """vLLM's FP8 MoE backend order for this release, GPU, checkpoint and parallel layout;
    batched: the all2all hands the experts the batched format (select_fp8_moe_backend)."""
    row = oracle_row(env.version)
    where = f"vLLM {row.versions.describe()}, {row.source}"
    if batched and row.style == "priority":
        return _vllm_batched(env, moe_backend, where)
    if moe_backend is not None and moe_backend != "auto":
        return _vllm_flag(row, moe_backend, where)
    if row.style == "priority":
        return _vllm_priority(row, env, capability, block, ep, where)
    return _vllm_opt_in(row, env, capability, moe_tp, where)


def _vllm_opt_in(row: OracleRow, env: EngineEnv, capability: tuple[int, int], moe_tp: int,
                 where: str) -> MoeChoice:
    """Before 0.16.0: FlashInfer only on request, then DeepGEMM, (CUTLASS), Triton."""
    fi_on = env.get("VLLM_USE_FLASHINFER_MOE_FP8") is True
    if fi_on and (row.style == "legacy" or capability[0] in (9, 10)):
        backend = _flashinfer_backend(env, capability) if row.style == "explicit" else (
            "FLASHINFER_TRTLLM" if env.get("VLLM_FLASHINFER_MOE_BACKEND") == "latency"
            else "FLASHINFER_CUTLASS")
        how = f"{_describe(env, 'VLLM_USE_FLASHINFER_MOE_FP8')} " \
              f"({_describe(env, 'VLLM_FLASHINFER_MOE_BACKEND')})"
        return MoeChoice(_kernels((backend,)), how, (f"{how}: MoE runs {backend} ({where})",))
    order = list(row.order)
    notes = []
    if row.style == "explicit" and moe_tp >= 8 and not env.is_set("VLLM_MOE_USE_DEEP_GEMM"):
        order.remove("DEEPGEMM")
        notes.append(f"MoE TP size {moe_tp} >= 8 and VLLM_MOE_USE_DEEP_GEMM not set: no "
                     f"DeepGEMM MoE ({where})")
    return MoeChoice(_kernels(order), None, tuple(notes))


def _vllm_batched(env: EngineEnv, moe_backend: str | None, where: str) -> MoeChoice:
    """The batched format: a named backend's batched twin (vLLM raises for one without), the
    explicit DeepGEMM variables, else BATCHED_DEEPGEMM then BATCHED_TRITON."""
    why = "batched MoE format (DeepEP low-latency / NIXL EP all2all)"
    if moe_backend is not None and moe_backend != "auto":
        twin = _BATCHED_TWIN.get(VLLM_MOE_BACKEND_FLAG.get(moe_backend, ""))
        if twin is None:
            raise WarmdInputError(f"--moe-backend {moe_backend} has no kernel for the {why}: "
                                  "vLLM would refuse to start")
        how = f"--moe-backend {moe_backend}"
        return MoeChoice(_kernels((twin,)), how, (f"{how}, {why}: MoE runs {twin} ({where})",))
    order = list(_BATCHED_ORDER)
    names = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM")
    if any(env.is_set(n) for n in names):
        how = ", ".join(_describe(env, n) for n in names if env.is_set(n))
        if all(env.get(n) for n in names):
            return MoeChoice(_kernels(("BATCHED_DEEPGEMM",)), how,
                             (f"{how}, {why}: MoE runs BATCHED_DEEPGEMM ({where})",))
        order.remove("BATCHED_DEEPGEMM")
    return MoeChoice(_kernels(order), None, (f"{why}: vLLM tries {', '.join(order)} ({where})",))


def _vllm_flag(row: OracleRow, moe_backend: str, where: str) -> MoeChoice:
    if not row.moe_backend_flag:
        raise WarmdInputError(f"--moe-backend is not a flag of vLLM {row.versions.describe()} "
                              "(added in 0.17.0)")
    backend = VLLM_MOE_BACKEND_FLAG.get(moe_backend)
    if backend is None:
        raise WarmdInputError(f"--moe-backend {moe_backend}: warmd plans FP8 MoE for "
                              f"{', '.join(VLLM_MOE_BACKEND_FLAG)} (or auto)")
    how = f"--moe-backend {moe_backend}"
    return MoeChoice(_kernels((backend,)), how, (f"{how}: MoE runs {backend} ({where})",))


def _vllm_priority(row: OracleRow, env: EngineEnv, capability: tuple[int, int], block: bool,
                   ep: int, where: str) -> MoeChoice:
    order = list(row.order)
    notes = []
    if row.hopper_block_rule and capability == (9, 0) and block:
        first = "FLASHINFER_CUTLASS" if ep > 1 else "TRITON"
        order.insert(0, order.pop(order.index(first)))
        layout = f"expert parallel (EP {ep})" if ep > 1 else "no expert parallel"
        notes.append(f"Hopper, block FP8, {layout}: vLLM tries {first} first ({where})")
    if row.flashinfer_env and env.is_set("VLLM_USE_FLASHINFER_MOE_FP8"):
        how = _describe(env, "VLLM_USE_FLASHINFER_MOE_FP8")
        if not env.get("VLLM_USE_FLASHINFER_MOE_FP8"):
            order = [b for b in order if not b.startswith("FLASHINFER")]
            notes.append(f"{how}: no FlashInfer MoE ({where})")
        else:
            if env.is_set("VLLM_FLASHINFER_MOE_BACKEND"):
                how += f", {_describe(env, 'VLLM_FLASHINFER_MOE_BACKEND')}"
                fi = [_flashinfer_backend(env, capability)]
            else:
                fi = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS"]
            return MoeChoice(_kernels(fi), how, (*notes, f"{how}: MoE runs FlashInfer "
                                                          f"only ({where})"))
    names = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM")
    if any(env.is_set(n) for n in names):
        how = ", ".join(_describe(env, n) for n in names if env.is_set(n))
        if all(env.get(n) for n in names):
            return MoeChoice(_kernels(("DEEPGEMM",)), how,
                             (*notes, f"{how} set explicitly: MoE runs DEEPGEMM ({where})"))
        order.remove("DEEPGEMM")
    return MoeChoice(_kernels(order), None, tuple(notes))


SGLANG_OVERRIDES = "python/sglang/srt/arg_groups/overrides.py"


def sglang_fp8_moe(runner: str | None, capability: tuple[int, int], model_type: str,
                   a2a: str, default: tuple[str, ...]) -> MoeChoice | None:
    """SGLang's --moe-runner-backend. auto on sm100 for a DeepSeek-V3-family FP8 model without
    an all-to-all backend resolves to flashinfer_trtllm (SGLang 0.5.23, overrides.py);
    otherwise auto (None) keeps warmd's SGLang order (DeepEP MoE with --moe-a2a-backend
    deepep, else Triton). A named runner is what the MoE runs."""
    if runner is None or runner == "auto":
        if capability[0] == 10 and model_type == "deepseek_v3" and a2a == "none":
            return MoeChoice(("TrtLlmFp8Experts", *default), None, (
                f"sm100, DeepSeek-V3 family, no --moe-a2a-backend: SGLang resolves "
                f"--moe-runner-backend auto to flashinfer_trtllm ({SGLANG_OVERRIDES})",))
        return None
    kernels = SGLANG_RUNNER_KERNELS.get(runner)
    if kernels is None:
        raise WarmdInputError(f"--moe-runner-backend {runner}: warmd plans FP8 MoE for "
                              f"{', '.join(SGLANG_RUNNER_KERNELS)} (or auto)")
    how = f"--moe-runner-backend {runner}"
    if runner.startswith("flashinfer_cut"):
        why = f"{how} has no FP8 MoE path: SGLang runs Triton ({_SGLANG_FP8_MOE} " \
              "Fp8MoEMethod.create_moe_runner)"
        return MoeChoice(kernels, how, (why,))
    if runner == "deep_gemm":
        path = "DeepEP" if a2a == "deepep" else "the standard dispatcher"
        return MoeChoice(kernels, how, (
            f"{how}: MoE runs DeepGEMM through {path} ({_SGLANG_FP8_MOE} "
            "Fp8MoEMethod.create_moe_runner; moe_runner/deep_gemm.py)",))
    return MoeChoice(kernels, how, (f"{how}: MoE runs {kernels[0]} ({SGLANG_SERVER_ARGS})",))
