"""What a plan is made from: the request data the CLI flags, a pasted serve command
(warmd.engines.launch) and the daemon's config map onto; the planner (warmd.plan) and the
engines' rules (warmd.engines) read it, and it imports neither."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanRequest:
    """Everything a plan is made from; the CLI flags, a pasted serve command
    (warmd.engines.launch) and the daemon's config map onto it. None leaves a value to the
    engine's own rules (warmd.engines.decide)."""

    model: str
    tp: int = 1
    ep: int = 1
    target: str | None = None
    capability: str | None = None
    sms: int | None = None
    with_libs: tuple[str, ...] = ()
    without_libs: tuple[str, ...] = ()
    engine: str = "vllm"
    mode: str | None = None
    max_tokens: int | None = None
    m_list: str | None = None
    quantization: str | None = None
    disabled_kernels: tuple[str, ...] = ()
    dp: int = 1
    chunked_prefill_size: int | None = None
    engine_version: str | None = None
    attention_backend: str | None = None
    moe_a2a_backend: str | None = None
    # vLLM's --moe-backend / SGLang's --moe-runner-backend (None: the engine's own choice).
    moe_backend: str | None = None
    # The engine's environment variables; None: this process's environment.
    engine_env: tuple[tuple[str, str], ...] | None = None
    # More of a serve command's arguments that the engine's rules read (warmd.engines.launch
    # LAUNCH_ARGS: --all2all-backend, --performance-mode, ...), and the ones given that can
    # change kernels but that warmd does not model (listed by the plan).
    launch_args: tuple[tuple[str, str], ...] = ()
    unmodelled_args: tuple[str, ...] = ()
    # A plan for the engine's node (`warmd plan`): for another GPU than this machine's, the
    # libraries the engine's release ships or pins are assumed there (warmd.engines.shipped)
    # instead of what this machine has. A warmup compiles here, so it probes here.
    engine_node: bool = False


def jsonable(value):
    """value with every tuple, nested in dicts and lists too, as a list (as JSON reads back)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
