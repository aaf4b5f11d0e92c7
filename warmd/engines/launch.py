"""A pasted serve command as plan input: `vllm serve MODEL ...`,
`python -m vllm.entrypoints.openai.api_server --model MODEL ...`,
`python -m sglang.launch_server --model-path MODEL ...` or `sglang serve ...`.

The command is parsed as the engine's own parser parses it (warmd.engines.cli_args: the flags
of the followed release, generated from its source): an argument the engine would refuse is
refused. Of what it accepts, the arguments that change which kernels run are read; those that
can change kernels but that warmd does not model are kept in `unmodelled` for the plan to
list; every other argument is the engine's business only.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from warmd.engines.cli_args import choices_of, flag_table, known_values, parse_engine_args
from warmd.errors import WarmdInputError

_PYTHONS = ("python", "python3")
_MODULES = {"vllm.entrypoints.openai.api_server": "vllm", "sglang.launch_server": "sglang"}
_SERVE_BINARIES = {"vllm": "vllm", "sglang": "sglang"}


def positive_int(flag: str, value: str) -> int:
    """An engine argument or variable that must be a positive integer."""
    try:
        number = int(value)
    except ValueError:
        raise WarmdInputError(f"{flag} must be an integer, got {value!r}") from None
    if number < 1:
        raise WarmdInputError(f"{flag} must be a positive integer, got {value!r}")
    return number


def _any_int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise WarmdInputError(f"{flag} must be an integer, got {value!r}") from None


def _text(flag: str, value) -> str:
    return str(value)


def _human_int(flag: str, value) -> int:
    """vLLM's human_readable_int (vllm/utils/argparse_utils.py): 16k = 16000, 16K = 16384."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return positive_int(flag, str(int(float(number) * 1000 ** ("kmgt".index(suffix)
                                                                        + 1))))
        if "." not in number:
            return positive_int(flag, str(int(number) * 1024 ** ("KMGT".index(suffix) + 1)))
    return positive_int(flag, text)


def _switch(flag: str, value) -> bool:
    return bool(value)


# The engine's argument (its parser's dest) -> (field of EngineLaunch, how to read the value).
_VLLM_READ = {
    "model": ("model", _text), "model_tag": ("model", _text),
    "tensor_parallel_size": ("tp", positive_int), "data_parallel_size": ("dp", positive_int),
    "enable_expert_parallel": ("expert_parallel", _switch),
    "max_num_batched_tokens": ("max_tokens", _human_int),
    "quantization": ("quantization", _text), "kv_cache_dtype": ("kv_cache_dtype", _text),
    "attention_backend": ("attention_backend", _text), "moe_backend": ("moe_backend", _text),
    "all2all_backend": ("all2all_backend", _text),
    "performance_mode": ("performance_mode", _text),
    "linear_backend": ("linear_backend", _text),
}
_SGLANG_READ = {
    "model_path": ("model", _text), "tp_size": ("tp", positive_int),
    "dp_size": ("dp", positive_int), "ep_size": ("ep", positive_int),
    "moe_a2a_backend": ("moe_a2a_backend", _text),
    "chunked_prefill_size": ("chunked_prefill_size", _any_int),
    "quantization": ("quantization", _text), "kv_cache_dtype": ("kv_cache_dtype", _text),
    "attention_backend": ("attention_backend", _text),
    "moe_runner_backend": ("moe_backend", _text),
    "enable_dp_attention": ("dp_attention", _switch),
    "fp8_gemm_runner_backend": ("fp8_gemm_backend", _text),
}
# Arguments each engine accepts that can change which kernels it compiles but that warmd does
# not model: a plan lists the ones given (kept to those the release's flag table has).
_UNMODELLED_KERNEL_ARGS = {
    "vllm": ("pipeline_parallel_size", "dtype", "compilation_config", "kernel_config",
             "speculative_config", "enable_eplb", "eplb_config", "hf_overrides", "config",
             "optimization_level", "block_size", "enforce_eager", "max_num_seqs",
             "enable_lora", "max_model_len", "decode_context_parallel_size",
             "prefill_context_parallel_size", "quantization_config", "mamba_backend",
             "enable_dbo", "cudagraph_capture_sizes", "max_cudagraph_capture_size"),
    "sglang": ("pp_size", "dtype", "speculative_algorithm", "ep_num_redundant_experts",
               "moe_dense_tp_size", "deepep_mode", "cuda_graph_max_bs", "disable_cuda_graph",
               "enable_torch_compile", "config", "json_model_override_args",
               "attn_dp_size", "enable_two_batch_overlap", "max_running_requests",
               "enable_lora", "decode_attention_backend", "prefill_attention_backend",
               "sampling_backend", "enable_eplb"),
}
@dataclass(frozen=True)
class EngineLaunch:
    """The kernel-relevant arguments of one serve command."""

    engine: str
    model: str | None = None
    tp: int = 1
    dp: int = 1
    ep: int = 1
    expert_parallel: bool = False
    max_tokens: int | None = None
    chunked_prefill_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_a2a_backend: str | None = None
    moe_backend: str | None = None
    all2all_backend: str | None = None
    performance_mode: str | None = None
    linear_backend: str | None = None
    dp_attention: bool = False
    fp8_gemm_backend: str | None = None
    # Given arguments that can change kernels but that warmd does not model, as typed.
    unmodelled: tuple[str, ...] = field(default=())


# EngineLaunch fields the engines' rules read beyond PlanRequest's own (warmd.engines.decide).
LAUNCH_ARGS = ("all2all_backend", "performance_mode", "linear_backend", "dp_attention",
               "fp8_gemm_backend")


def split_command(command: str | list[str] | tuple[str, ...]) -> list[str]:
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as exc:
            raise WarmdInputError(f"cannot split the engine command: {exc}") from None
    return [str(part) for part in command]


def detect_engine(tokens: list[str]) -> tuple[str, list[str], bool]:
    """(engine, its arguments, whether it is the `vllm serve` / `sglang serve` form, whose
    parsers take a positional model)."""
    if not tokens:
        raise WarmdInputError("empty engine command")
    binary = Path(tokens[0]).name
    if binary in _SERVE_BINARIES and tokens[1:2] == ["serve"]:
        return _SERVE_BINARIES[binary], tokens[2:], True
    is_python = binary in _PYTHONS or (binary.startswith("python3.") and
                                       binary[8:].isdigit())
    if is_python and tokens[1:2] == ["-m"] and len(tokens) > 2 and tokens[2] in _MODULES:
        return _MODULES[tokens[2]], tokens[3:], False
    shown = " ".join(tokens[:3])
    raise WarmdInputError(
        f"unknown engine command {shown!r}: expected 'vllm serve MODEL ...', 'python -m "
        "vllm.entrypoints.openai.api_server ...', 'python -m sglang.launch_server ...' or "
        "'sglang serve ...'")


def parse_launch(command: str | list[str] | tuple[str, ...],
                 version: str | None = None) -> EngineLaunch:
    """The kernel-relevant arguments of a serve command, read as the engine's own parser
    reads it (warmd.engines.cli_args); raises on an unknown engine binary, an argument the
    engine would refuse, or a bad value of an argument warmd reads. `version` (the given
    --engine-version): a release newer than the followed one passes arguments it may have
    added, kept as unmodelled."""
    engine, args, serve_form = detect_engine(split_command(command))
    parsed = parse_engine_args(engine, args, serve_form, version)
    table = _VLLM_READ if engine == "vllm" else _SGLANG_READ
    values: dict = {}
    # vllm serve: the positional model (where --model was moved to) is the model.
    for dest in sorted(table, key=lambda d: d == "model_tag"):
        if dest in parsed.values and parsed.values[dest] is not None:
            key, read = table[dest]
            flag = parsed.spelled.get(dest, dest)
            values[key] = read(flag, parsed.values[dest])
    if engine == "vllm" and not serve_form:
        values["model"] = parsed.values.get("model")  # api_server ignores a positional
    unmodelled = tuple(parsed.spelled.get(dest, dest)
                       for dest in _UNMODELLED_KERNEL_ARGS[engine] if dest in parsed.values)
    unmodelled += parsed.passed
    launch = EngineLaunch(engine, **values, unmodelled=unmodelled)
    _check_choices(launch)
    if not launch.model:
        where = "MODEL after 'serve' or --model" if engine == "vllm" else "--model-path"
        raise WarmdInputError(f"the engine command names no model ({where})")
    return launch


def _check_choices(launch: EngineLaunch) -> None:
    if launch.moe_backend is not None:
        check_moe_backend(launch.engine, launch.moe_backend)
    known = known_values(launch.engine, "kv_cache_dtype")
    if launch.kv_cache_dtype is not None and known and launch.kv_cache_dtype not in known:
        # vllm/config/cache.py CacheConfig._validate_cache_dtype refuses it after parsing
        raise WarmdInputError(f"--kv-cache-dtype {launch.kv_cache_dtype!r} is not one of "
                              f"{', '.join(known)}")


def check_moe_backend(engine: str, value: str) -> None:
    """vLLM's --moe-backend (vllm/config/kernel.py MoEBackend; its parser lowercases and
    turns dashes into underscores) or SGLang's --moe-runner-backend (server_args.py): the
    choices of the followed release's flag table."""
    flag, dest = ("--moe-runner-backend", "moe_runner_backend") if engine == "sglang" \
        else ("--moe-backend", "moe_backend")
    known = choices_of(engine, dest)
    if value not in known:
        raise WarmdInputError(f"{flag} {value!r} is not one of {', '.join(known)}")


def _expert_parallel(launch: EngineLaunch) -> int:
    """The EP size the engine will run with. vLLM: --enable-expert-parallel spreads experts
    over all TP x DP ranks (vllm/model_executor/layers/fused_moe/config.py). SGLang:
    --moe-a2a-backend deepep (or mooncake) sets ep_size = tp_size (_handle_a2a_moe in
    python/sglang/srt/server_args.py), else --ep as given."""
    if launch.engine == "vllm":
        enabled = launch.expert_parallel
        return launch.tp * launch.dp if enabled and launch.tp * launch.dp > 1 else 1
    if launch.moe_a2a_backend in ("deepep", "mooncake"):
        return launch.tp
    return launch.ep


def _quantization(launch: EngineLaunch, model_path: str) -> str | None:
    """The engine's --quantization as a warmd scheme: the checkpoint's own method needs no
    override; `fp8` on an unquantized checkpoint is vLLM/SGLang's online per-tensor FP8."""
    if launch.quantization is None:
        return None
    from warmd.models import language_config
    from warmd.models.config_json import load_config

    config = language_config(load_config(model_path)[0])
    method = str((config.get("quantization_config") or {}).get("quant_method", "")).lower()
    wanted = launch.quantization.lower()
    if wanted == method or (wanted == "fp8" and method == "fp8"):
        return None
    if wanted == "fp8" and not method:
        return "fp8_tensor"
    if wanted in ("mxfp8",):
        return wanted
    raise WarmdInputError(f"--quantization {launch.quantization} does not match the "
                          f"checkpoint ({method or 'unquantized'}); warmd plans fp8 on an "
                          "unquantized checkpoint or the checkpoint's own method")


def launch_request(command: str | list[str] | tuple[str, ...], base=None):
    """The PlanRequest a serve command makes; `base` supplies what the command cannot say
    (target, library overrides, explicit M values)."""
    from warmd.engines.hub import resolve_model
    from warmd.request import PlanRequest

    launch = parse_launch(command, base.engine_version if base is not None else None)
    model = resolve_model(launch.model)
    fields = dict(model=model, engine=launch.engine, tp=launch.tp, dp=launch.dp,
                  ep=_expert_parallel(launch), max_tokens=launch.max_tokens,
                  chunked_prefill_size=launch.chunked_prefill_size,
                  quantization=_quantization(launch, model),
                  attention_backend=launch.attention_backend,
                  moe_a2a_backend=launch.moe_a2a_backend, moe_backend=launch.moe_backend,
                  launch_args=tuple((name, str(getattr(launch, name))) for name in LAUNCH_ARGS
                                    if getattr(launch, name) not in (None, False)),
                  unmodelled_args=launch.unmodelled)
    if base is None:
        return PlanRequest(**fields)
    return replace(base, **fields)


# A field a serve command fills in -> the warmd option that sets it (hints for an engine's
# flag given to warmd itself).
_WARMD_OPTIONS = {"model": "--model", "tp": "--tp", "dp": "--dp", "ep": "--ep",
                  "max_tokens": "--max-tokens", "quantization": "--quantization",
                  "chunked_prefill_size": "--chunked-prefill-size",
                  "attention_backend": "--attention-backend", "moe_backend": "--moe-backend",
                  "moe_a2a_backend": "--moe-a2a-backend"}
_ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def engine_flag_hint(option: str, command: str) -> str | None:
    """For an engine's serve flag given as an option of a warmd command (`warmd plan
    --tensor-parallel-size 8`): which warmd option says the same, and the serve-command
    form that takes the engine's flags as they are; None when no engine has the flag."""
    for engine, reads in (("vllm", _VLLM_READ), ("sglang", _SGLANG_READ)):
        for entry in flag_table(engine)["options"]:
            if option not in entry["strings"]:
                continue
            ours = _WARMD_OPTIONS.get(reads.get(entry["dest"], ("",))[0])
            instead = f"use {ours}, or give" if ours else "give"
            return (f"{option} is {_ENGINE_NAMES[engine]}'s flag, not {command}'s: {instead} "
                    f"the serve command after --: {command} -- {_SERVE_BINARIES[engine]} "
                    f"serve MODEL {option} ...")
    return None
