"""A parsed warmd.yaml (or a config's JSON) checked into a WarmdConfig: every key known,
every value of its type and range; the first bad field fails in one line."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from warmd.config import (
    CAPTURE_TRUST,
    SECTIONS,
    AgentConfig,
    BuilderConfig,
    CacheConfig,
    CaptureConfig,
    ModelConfig,
    NodeSelector,
    RayConfig,
    RedisConfig,
    WarmdConfig,
    section_docs,
    yaml_keys,
)
from warmd.config.validate import (
    check_keys,
    check_type,
    engine_command,
    engine_env,
    fail,
    positive,
    str_list,
)
from warmd.errors import WarmdInputError

MAX_MODELS = 256  # a fleet's warmd.yaml lists many models; beyond this it is refused

_RENAMES = {name: f.name for name, f in yaml_keys(ModelConfig).items() if name != f.name}


def _model_keys() -> dict[str, Any]:
    return {name: f.metadata["types"] for name, f in yaml_keys(ModelConfig).items()}


def _top_keys() -> set[str]:
    return {"version", *yaml_keys(WarmdConfig)}


def _parse_model(where: str, data) -> ModelConfig:
    from warmd.kernels.preferences import ENGINES
    from warmd.mvalues import MODES

    model_keys = _model_keys()
    check_keys(where, data, model_keys)
    if "path" not in data and not data.get("engine_command"):
        raise fail(where, "missing required key 'path' (or 'engine_command')")
    for name, value in data.items():
        if value is not None or name == "path":
            check_type(f"{where}.{name}", value, model_keys[name])
    values = {_RENAMES.get(k, k): v for k, v in data.items() if v is not None}
    for key in ("engine_command", "env"):  # empty ones (as to_json writes them) are absent
        if not values.get(key, True):
            del values[key]
    if "engine_command" in values:
        values["engine_command"] = engine_command(f"{where}.engine_command",
                                                   values["engine_command"])
        values.setdefault("path", values["engine_command"][0])
    if "env" in values:
        values["env"] = engine_env(f"{where}.env", values["env"])
    for key in ("with_libs", "without_libs", "disable_kernels", "libraries"):
        if key in values:
            values[key] = str_list(f"{where}.{key}", values[key])
    for key in ("tp", "ep", "max_tokens"):
        if key in values:
            positive(f"{where}.{key}", values[key])
    if isinstance(values.get("m_list"), list):
        if not all(isinstance(m, int) and not isinstance(m, bool) and m > 0
                   for m in values["m_list"]):
            raise fail(f"{where}.m_list", "expected positive integers")
        values["m_list"] = ",".join(str(m) for m in values["m_list"])
    if values.get("engine", "vllm") not in ENGINES:
        raise fail(f"{where}.engine", f"unknown engine {values['engine']!r} "
                                       f"(known: {', '.join(ENGINES)})")
    if values.get("mode", "relax") not in MODES:
        raise fail(f"{where}.mode", f"unknown mode {values['mode']!r} "
                                     f"(known: {', '.join(MODES)})")
    from warmd.libraries import LIBRARIES

    for lib in values.get("libraries", ()):
        if lib not in LIBRARIES:
            raise fail(f"{where}.libraries", f"unknown library {lib!r} "
                                              f"(known: {', '.join(LIBRARIES)})")
    if "task_filter" in values:
        try:
            re.compile(values["task_filter"])
        except re.error as exc:
            raise fail(f"{where}.task_filter", f"not a valid regular expression: {exc}") from None
    values.setdefault("name", Path(values["path"].rstrip("/")).name or values["path"])
    return ModelConfig(**values)


def _section_keys(name: str) -> dict[str, Any]:
    if name == "cache":
        return dict.fromkeys(section_docs("cache"), str)
    return {k: f.metadata["types"] for k, f in yaml_keys(SECTIONS[name]).items()}


def _parse_section(name: str, data) -> dict:
    where = name
    if data is None:
        return {}
    keys = _section_keys(name)
    check_keys(where, data, keys)
    out = {}
    for key, value in data.items():
        if value is None:
            continue
        check_type(f"{where}.{key}", value, keys[key])
        out[key] = value
    return out


def parse_config(data, source: str = "<config>") -> WarmdConfig:
    """Validate a parsed warmd.yaml; raises WarmdInputError naming the first bad field."""
    try:
        return _parse(data)
    except WarmdInputError as exc:
        raise WarmdInputError(f"{source}: {exc}") from None


def _parse(data) -> WarmdConfig:
    if data is None:
        data = {}
    check_keys("config", data, _top_keys())
    if data.get("version", 1) != 1:
        raise fail("version", f"unsupported config version {data['version']!r} (known: 1)")
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise fail("models", "expected a non-empty list of models")
    if len(models) > MAX_MODELS:
        raise fail("models", f"{len(models)} models, over warmd's bound of {MAX_MODELS}")
    parsed = tuple(_parse_model(f"models[{i}]", m) for i, m in enumerate(models))
    names = [m.name for m in parsed]
    if len(set(names)) != len(names):
        raise fail("models", f"model names must be unique, got {names}")
    sections = {name: _parse_section(name, data.get(name)) for name in SECTIONS}
    nodes = sections["nodes"]
    labels = nodes.get("labels", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise fail("nodes.labels", "expected a mapping of strings to strings")
    agent = sections["agent"]
    for key in ("reconcile_seconds", "heartbeat_seconds"):
        if key in agent:
            positive(f"agent.{key}", agent[key])
    if "metrics_port" in agent and not 0 <= agent["metrics_port"] <= 65535:
        raise fail("agent.metrics_port", f"must be 0..65535, got {agent['metrics_port']}")
    capture = sections["capture"]
    if capture.get("trust", "rederive") not in CAPTURE_TRUST:
        raise fail("capture.trust", f"unknown trust {capture['trust']!r} (known: "
                                     f"{', '.join(CAPTURE_TRUST)})")
    capture["rederive_nodes"] = str_list("capture.rederive_nodes",
                                          capture.get("rederive_nodes", []))
    capture["triton_modules"] = str_list("capture.triton_modules",
                                          capture.get("triton_modules", []))
    key_file = data.get("signing_key_file")
    if key_file is not None:
        check_type("signing_key_file", key_file, str)
    return WarmdConfig(
        models=parsed,
        redis=RedisConfig(**sections["redis"]),
        cache=CacheConfig(tuple(sorted(sections["cache"].items()))),
        signing_key_file=key_file,
        nodes=NodeSelector(tuple(sorted(labels.items())),
                           str_list("nodes.gpu_types", nodes.get("gpu_types", []))),
        builders=BuilderConfig(**sections["builders"]),
        capture=CaptureConfig(**capture),
        agent=AgentConfig(**{k: (float(v) if k.endswith("_seconds") else v)
                             for k, v in agent.items()}),
        ray=RayConfig(**sections["ray"]),
    )


def _unrename(data: dict) -> dict:
    out = dict(data)
    out["models"] = [{next((k for k, v in _RENAMES.items() if v == key), key): value
                      for key, value in m.items()} for m in data.get("models", [])]
    return out



def config_from_json(data: dict) -> WarmdConfig:
    """Inverse of WarmdConfig.to_json (configs travel between the CLI, controller and agents
    as JSON)."""
    source = data.get("source", "<json>")
    body = {k: v for k, v in data.items() if k != "source"}
    return replace(parse_config(_unrename(body), source), source=source)
