"""What the engine's launch decides before any kernel is selected: which kernels its
environment and flags rule out, which M values its warmup and traffic reach, and how it
splits experts. Every decision that departs from the default is kept as a note for the plan.
Each engine's own rules are warmd.engines.decide_vllm and warmd.engines.decide_sglang; the
Decisions they fill, warmd.engines.decisions."""

from __future__ import annotations

from dataclasses import replace

from warmd.engines.decide_sglang import SGLANG_FP8_GEMM_BACKENDS, decide_sglang
from warmd.engines.decide_vllm import decide_vllm, vllm_all2all
from warmd.engines.decisions import Decisions
from warmd.engines.environment import EngineEnv
from warmd.engines.launch import check_moe_backend
from warmd.engines.moe_backends import BATCHED_ALL2ALL, MoeChoice, sglang_fp8_moe, vllm_fp8_moe
from warmd.engines.rules import BY_ID, vllm_refined_moe_block
from warmd.errors import WarmdInputError
from warmd.targets import Target


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


def decide(request, env: EngineEnv, target: Target) -> Decisions:
    """Apply the engine's environment and launch flags on the target GPU; raises on bad
    input."""
    if request.moe_backend is not None:
        check_moe_backend(request.engine, request.moe_backend)
    out = (decide_sglang if request.engine == "sglang" else decide_vllm)(request, env, target)
    unmodelled = [*request.unmodelled_args, *_read_not_followed(request)]
    if unmodelled:
        out.notes.append(f"not modelled by warmd, may change kernels: {', '.join(unmodelled)}")
    return out


# Launch arguments read from a serve command whose kernel effect warmd does not follow yet
# (docs/selection.md "Not followed yet"): SGLang's DP attention.
_READ_NOT_FOLLOWED = {"dp_attention": "--enable-dp-attention"}


def _read_not_followed(request) -> list[str]:
    given = dict(getattr(request, "launch_args", ()) or ())
    out = [f"{flag} {given[name]}" if given[name] != "True" else flag
           for name, flag in _READ_NOT_FOLLOWED.items() if name in given]
    gemm = given.get("fp8_gemm_backend")
    if gemm not in (None, "auto", *SGLANG_FP8_GEMM_BACKENDS):
        out.append(f"--fp8-gemm-backend {gemm}")
    return out


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
