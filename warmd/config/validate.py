"""The checks of one warmd.yaml field: each fails with one line naming the field."""

from __future__ import annotations

import difflib
import math

from warmd.errors import WarmdInputError


def fail(where: str, message: str) -> WarmdInputError:
    return WarmdInputError(f"{where}: {message}")


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a mapping"}
    return " or ".join(names[k] for k in kinds)


def check_type(where: str, value, kind) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    bool_mismatch = isinstance(value, bool) and bool not in kinds  # bool is an int subclass
    if bool_mismatch or not isinstance(value, kinds):
        raise fail(where, f"expected {_type_name(kind)}, got {value!r}")


def check_keys(where: str, data, known) -> None:
    if not isinstance(data, dict):
        raise fail(where, f"expected a mapping, got {data!r}")
    for name in data:
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close
                    else f"known: {', '.join(sorted(known))}")
            raise fail(where, f"unknown key {name!r} ({hint})")


def str_list(where: str, value) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v for v in value):
        raise fail(where, f"expected a list of strings, got {value!r}")
    return tuple(value)


def positive(where: str, value, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise fail(where, f"must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")


def engine_command(where: str, value) -> tuple[str, ...]:
    from warmd.engines.launch import parse_launch, split_command

    tokens = tuple(split_command(value)) if isinstance(value, str) else str_list(where, value)
    try:
        parse_launch(tokens)  # checked here; the model path resolves on each node
    except WarmdInputError as exc:
        raise fail(where, str(exc)) from None
    return tuple(tokens)


def engine_env(where: str, value) -> tuple[tuple[str, str], ...]:
    from warmd.engines.cache_dirs import CACHE_VARIABLES
    from warmd.engines.environment import BY_NAME, EngineEnv

    if isinstance(value, list):  # [[name, value], ...] as to_json writes it
        if not all(isinstance(p, list) and len(p) == 2 for p in value):
            raise fail(where, "expected a mapping of variable names to strings")
        value = dict(value)
    if not all(isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
               for k, v in value.items()):
        raise fail(where, "expected a mapping of variable names to strings")
    pairs = {k: str(v) for k, v in value.items()}
    known = {*BY_NAME, "SGL_ENABLE_JIT_DEEPGEMM", *CACHE_VARIABLES}
    unknown = sorted(set(pairs) - known)
    if unknown:
        raise fail(where, f"unknown engine variable {unknown[0]!r} (known: "
                           f"{', '.join(sorted(known))})")
    try:
        EngineEnv.of("vllm", pairs, None)
    except WarmdInputError as exc:
        raise fail(where, str(exc)) from None
    return tuple(sorted(pairs.items()))
