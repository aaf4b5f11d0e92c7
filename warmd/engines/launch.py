"""A pasted serve command as plan input: `vllm serve MODEL ...`,
`python -m vllm.entrypoints.openai.api_server --model MODEL ...`,
`python -m sglang.launch_server --model-path MODEL ...` or `sglang serve ...`.

Only the arguments that change which kernels run are read; every other argument of a known
engine is ignored. Flag spellings follow the engines' parsers: vLLM's
vllm/engine/arg_utils.py (its FlexibleArgumentParser, vllm/utils/argparse_utils.py, also takes
underscores for dashes), SGLang's python/sglang/srt/server_args.py (argparse, whose prefix
abbreviations make `--tp` and `--dp` the usual spellings of --tp-size and --dp-size).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

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


def _text(flag: str, value: str) -> str:
    return value


# flag -> (field of EngineLaunch, parser); a None parser is a switch.
_VLLM_FLAGS = {
    "--model": ("model", _text),
    "--tensor-parallel-size": ("tp", positive_int), "-tp": ("tp", positive_int),
    "--data-parallel-size": ("dp", positive_int), "-dp": ("dp", positive_int),
    "--enable-expert-parallel": ("expert_parallel", None), "-ep": ("expert_parallel", None),
    "--no-enable-expert-parallel": ("no_expert_parallel", None),
    "--max-num-batched-tokens": ("max_tokens", positive_int),
    "--quantization": ("quantization", _text), "-q": ("quantization", _text),
    "--kv-cache-dtype": ("kv_cache_dtype", _text),
    "--attention-backend": ("attention_backend", _text),
    "--moe-backend": ("moe_backend", _text),
}
_SGLANG_FLAGS = {
    "--model-path": ("model", _text), "--model": ("model", _text),
    "--tensor-parallel-size": ("tp", positive_int), "--tp-size": ("tp", positive_int),
    "--tp": ("tp", positive_int),
    "--data-parallel-size": ("dp", positive_int), "--dp-size": ("dp", positive_int),
    "--dp": ("dp", positive_int),
    "--expert-parallel-size": ("ep", positive_int), "--ep-size": ("ep", positive_int),
    "--ep": ("ep", positive_int),
    "--moe-a2a-backend": ("moe_a2a_backend", _text),
    "--chunked-prefill-size": ("chunked_prefill_size", _any_int),
    "--quantization": ("quantization", _text),
    "--kv-cache-dtype": ("kv_cache_dtype", _text),
    "--attention-backend": ("attention_backend", _text),
    "--moe-runner-backend": ("moe_backend", _text),
}
# SGLang's MOE_A2A_BACKEND_CHOICES (python/sglang/srt/server_args.py).
SGLANG_A2A_BACKENDS = ("none", "deepep", "mooncake", "ascend_fuseep", "mori", "flashinfer",
                       "nixl")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                   "fp8_ds_mla", "fp4_e2m1")


@dataclass(frozen=True)
class EngineLaunch:
    """The kernel-relevant arguments of one serve command."""

    engine: str
    model: str | None = None
    tp: int = 1
    dp: int = 1
    ep: int = 1
    expert_parallel: bool = False
    no_expert_parallel: bool = False
    max_tokens: int | None = None
    chunked_prefill_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_a2a_backend: str | None = None
    moe_backend: str | None = None
    ignored: tuple[str, ...] = field(default=())


def split_command(command: str | list[str] | tuple[str, ...]) -> list[str]:
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as exc:
            raise WarmdInputError(f"cannot split the engine command: {exc}") from None
    return [str(part) for part in command]


def detect_engine(tokens: list[str]) -> tuple[str, list[str], str | None]:
    """(engine, its arguments, the positional model if the form has one)."""
    if not tokens:
        raise WarmdInputError("empty engine command")
    binary = Path(tokens[0]).name
    if binary in _SERVE_BINARIES and tokens[1:2] == ["serve"]:
        rest = tokens[2:]
        if rest and not rest[0].startswith("-"):
            return _SERVE_BINARIES[binary], rest[1:], rest[0]
        return _SERVE_BINARIES[binary], rest, None
    is_python = binary in _PYTHONS or (binary.startswith("python3.") and
                                       binary[8:].isdigit())
    if is_python and tokens[1:2] == ["-m"] and len(tokens) > 2 and tokens[2] in _MODULES:
        return _MODULES[tokens[2]], tokens[3:], None
    shown = " ".join(tokens[:3])
    raise WarmdInputError(
        f"unknown engine command {shown!r}: expected 'vllm serve MODEL ...', 'python -m "
        "vllm.entrypoints.openai.api_server ...', 'python -m sglang.launch_server ...' or "
        "'sglang serve ...'")


def _flag_and_value(token: str, engine: str) -> tuple[str, str | None]:
    name, eq, value = token.partition("=")
    if engine == "vllm" and name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, (value if eq else None)


def parse_launch(command: str | list[str] | tuple[str, ...]) -> EngineLaunch:
    """The kernel-relevant arguments of a serve command; raises on an unknown engine binary
    or a bad value of an argument warmd reads."""
    engine, args, positional = detect_engine(split_command(command))
    table = _VLLM_FLAGS if engine == "vllm" else _SGLANG_FLAGS
    values: dict = {"model": positional}
    ignored = []
    i = 0
    while i < len(args):
        name, value = _flag_and_value(args[i], engine)
        i += 1
        if name not in table:
            ignored.append(args[i - 1])
            continue
        key, parse = table[name]
        if parse is None:
            values[key] = True
            continue
        if value is None:
            if i >= len(args):
                raise WarmdInputError(f"{name} in the engine command needs a value")
            value, i = args[i], i + 1
        if key == "moe_backend" and engine == "vllm":
            value = value.lower().replace("-", "_")
        values[key] = parse(name, value)
    launch = EngineLaunch(engine, **values, ignored=tuple(ignored))
    _check_choices(launch)
    if not launch.model:
        where = "MODEL after 'serve' or --model" if engine == "vllm" else "--model-path"
        raise WarmdInputError(f"the engine command names no model ({where})")
    return launch


def _check_choices(launch: EngineLaunch) -> None:
    if launch.moe_a2a_backend is not None and launch.moe_a2a_backend not in SGLANG_A2A_BACKENDS:
        raise WarmdInputError(f"--moe-a2a-backend {launch.moe_a2a_backend!r} is not one of "
                              f"{', '.join(SGLANG_A2A_BACKENDS)}")
    if launch.moe_backend is not None:
        check_moe_backend(launch.engine, launch.moe_backend)
    if launch.kv_cache_dtype is not None and launch.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise WarmdInputError(f"--kv-cache-dtype {launch.kv_cache_dtype!r} is not one of "
                              f"{', '.join(KV_CACHE_DTYPES)}")


def check_moe_backend(engine: str, value: str) -> None:
    """vLLM's --moe-backend (vllm/config/kernel.py MoEBackend; its parser lowercases and
    turns dashes into underscores) or SGLang's --moe-runner-backend (server_args.py)."""
    from warmd.engines.moe_backends import (
        SGLANG_MOE_RUNNER_BACKENDS,
        VLLM_MOE_BACKEND_FLAG,
        VLLM_MOE_BACKEND_OTHER,
    )

    if engine == "sglang":
        flag, known = "--moe-runner-backend", SGLANG_MOE_RUNNER_BACKENDS
    else:
        flag, known = "--moe-backend", (*VLLM_MOE_BACKEND_FLAG, *VLLM_MOE_BACKEND_OTHER)
    if value not in known:
        raise WarmdInputError(f"{flag} {value!r} is not one of {', '.join(known)}")


def _expert_parallel(launch: EngineLaunch) -> int:
    """The EP size the engine will run with. vLLM: --enable-expert-parallel spreads experts
    over all TP x DP ranks (vllm/model_executor/layers/fused_moe/config.py). SGLang:
    --moe-a2a-backend deepep (or mooncake) sets ep_size = tp_size (_handle_a2a_moe in
    python/sglang/srt/server_args.py), else --ep as given."""
    if launch.engine == "vllm":
        enabled = launch.expert_parallel and not launch.no_expert_parallel
        return launch.tp * launch.dp if enabled and launch.tp * launch.dp > 1 else 1
    if launch.moe_a2a_backend in ("deepep", "mooncake"):
        return launch.tp
    return launch.ep


def _quantization(launch: EngineLaunch, model_path: str) -> str | None:
    """The engine's --quantization as a warmd scheme: the checkpoint's own method needs no
    override; `fp8` on an unquantized checkpoint is vLLM/SGLang's online per-tensor FP8."""
    if launch.quantization is None:
        return None
    from warmd.models import language_config, load_config

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

    launch = parse_launch(command)
    model = resolve_model(launch.model)
    fields = dict(model=model, engine=launch.engine, tp=launch.tp, dp=launch.dp,
                  ep=_expert_parallel(launch), max_tokens=launch.max_tokens,
                  chunked_prefill_size=launch.chunked_prefill_size,
                  quantization=_quantization(launch, model),
                  attention_backend=launch.attention_backend,
                  moe_a2a_backend=launch.moe_a2a_backend, moe_backend=launch.moe_backend)
    if base is None:
        return PlanRequest(**fields)
    return replace(base, **fields)
