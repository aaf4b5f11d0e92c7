"""Options shared by every command that makes a plan."""

from __future__ import annotations

import functools

import click

from warmd.kernels.preferences import ENGINES
from warmd.libraries import probe_names
from warmd.mvalues import MODES
from warmd.plan import PlanRequest
from warmd.targets import PRESETS


def plan_options(func=None, *, model_help: str = ""):
    """--model, parallelism, target and library overrides, engine and M-value mode.

    As @plan_options --model is required; @plan_options(model_help=...) makes it optional
    (the command then checks it, see require_model) and adds model_help to its help."""
    if func is None:
        return functools.partial(_plan_options, model_required=False, model_help=model_help)
    return _plan_options(func, model_required=True, model_help="")


def require_model(request: PlanRequest) -> None:
    """The usage error of a missing --model, for commands where it is optional."""
    if not request.model:
        raise click.UsageError("Missing option '--model' (or a serve command after --)")


def _plan_options(func, model_required: bool, model_help: str):
    options = [
        click.option("--model", "-m", metavar="PATH",
                     help="A local config.json, a directory holding one, or a bundled example "
                          "name (deepseek-v3, qwen3-30b-a3b-fp8, llama-3.1-8b, mixtral-8x7b)."
                          + (f" {model_help}" if model_help else "")),
        click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size."),
        click.option("--ep", type=int, default=1, show_default=True,
                     help="Expert parallel size (experts split across ranks; vLLM: 1 or "
                          "TP x DP)."),
        click.option("--dp", type=int, default=1, show_default=True,
                     help="Data parallel size (vLLM's MoE sees every DP rank's tokens)."),
        click.option("--target", "-t", metavar="PRESET",
                     help=f"Plan for a GPU preset ({', '.join(PRESETS)}) instead of the local "
                          "GPU. Needs no local GPU."),
        click.option("--capability", metavar="X.Y",
                     help="Plan for a custom GPU of this compute capability (with --sms). With "
                          "--target it must equal the preset's (else exit 2)."),
        click.option("--sms", type=int,
                     help="SM count of the custom GPU (with --capability). With --target it "
                          "must equal the preset's (else exit 2)."),
        click.option("--with", "with_libs", multiple=True, metavar="LIB",
                     help=f"Plan as if LIB ({', '.join(probe_names())}) were installed. "
                          "Repeatable."),
        click.option("--without", "without_libs", multiple=True, metavar="LIB",
                     help="Plan as if LIB were missing. Repeatable."),
        click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True,
                     help="Serving engine whose kernel choices to follow."),
        click.option("--engine-version", metavar="X.Y.Z",
                     help="Follow this engine release's rules (default: the installed one)."),
        click.option("--mode", type=click.Choice(MODES),
                     help="M values to warm: every M, vLLM's relax set, or SGLang's fast set "
                          "(default: what the engine's own warmup does)."),
        click.option("--max-tokens", type=int,
                     help="Largest M (default: the engine's own: vLLM's "
                          "--max-num-batched-tokens for the GPU, 8192 on an H200; SGLang's "
                          "precompile range)."),
        click.option("--chunked-prefill-size", type=int,
                     help="SGLang's --chunked-prefill-size (sets its DeepGEMM M range)."),
        click.option("--attention-backend", metavar="NAME",
                     help="The engine's --attention-backend (e.g. FLASHINFER, fa3)."),
        click.option("--moe-a2a-backend", metavar="NAME",
                     help="SGLang's --moe-a2a-backend (deepep runs DeepGEMM MoE)."),
        click.option("--moe-backend", metavar="NAME",
                     help="vLLM's --moe-backend / SGLang's --moe-runner-backend (e.g. "
                          "flashinfer_cutlass, deep_gemm, triton)."),
        click.option("--m-list", metavar="M,M,...", help="Explicit M values instead of --mode."),
        click.option("--quantization", metavar="SCHEME",
                     help="Override the checkpoint's quantization (fp8_block, fp8_tensor, mxfp8, "
                          "bf16)."),
        click.option("--disable-kernel", "disabled_kernels", multiple=True, metavar="NAME",
                     help="Never select this kernel (also WARMD_DISABLED_KERNELS, "
                          "VLLM_DISABLED_KERNELS). Repeatable."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        command = kwargs.pop("engine_command")
        values = {name: kwargs.pop(name) for name in PLAN_FIELDS}
        request = _request(values, command, model_required)
        return func(*args, request=request, **kwargs)

    options.append(click.argument("engine_command", nargs=-1, type=click.UNPROCESSED,
                                  metavar="[-- ENGINE COMMAND]"))
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


PLAN_FIELDS = ("model", "tp", "ep", "target", "capability", "sms", "with_libs", "without_libs",
               "engine", "mode", "max_tokens", "m_list", "quantization", "disabled_kernels", "dp",
               "chunked_prefill_size", "engine_version", "attention_backend", "moe_a2a_backend",
               "moe_backend")
# What a serve command says itself; giving one of these too is a conflict.
_COMMAND_FIELDS = ("model", "tp", "ep", "dp", "engine", "max_tokens", "quantization",
                   "chunked_prefill_size", "attention_backend", "moe_a2a_backend",
                   "moe_backend")


def _request(values: dict, command: tuple[str, ...], model_required: bool) -> PlanRequest:
    """The request from the flags, or from a serve command after `--` (plus the flags it
    cannot express: target, libraries, M mode or list, disabled kernels, engine version).
    An engine version newer than warmd's rules gets one line on stderr naming the release
    whose rules apply."""
    from warmd.engines.cli_args import rules_note

    request = _request_of(values, command, model_required)
    note = rules_note(request.engine, request.engine_version)
    if note:
        click.echo(note, err=True)
    return request


def _request_of(values: dict, command: tuple[str, ...], model_required: bool) -> PlanRequest:
    from warmd.engines.launch import launch_request

    if not command:
        request = PlanRequest(**values)
        if model_required:
            require_model(request)
        return request
    ctx = click.get_current_context()
    given = [name for name in _COMMAND_FIELDS
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise click.UsageError(f"{flag} conflicts with the serve command after --: "
                               "the command says it")
    return launch_request(command, PlanRequest(**{**values, "model": ""}))
