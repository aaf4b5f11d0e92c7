"""The daemon's configuration: warmd.yaml, then WARMD_* environment, then command-line flags.

Loading validates everything that can be checked anywhere (keys, types, engine and mode names)
and fails with one line naming the bad field. What only a node can check (does the model path
exist there? is there a GPU?) is checked by that node's agent, which turns a problem into that
node's FAILED state instead of stopping the whole cluster.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from warmd import settings
from warmd.errors import WarmdInputError
from warmd.examples import EXAMPLES_DIR
from warmd.request import PlanRequest, jsonable

DEFAULT_CONFIG = EXAMPLES_DIR / "warmd.yaml"
DEFAULT_METRICS_PORT = 9464
LOOPBACK = "127.0.0.1"  # what every endpoint binds to unless the config names an address


def _key(types, doc: str, default: Any = MISSING, *, yaml: str | None = None,
        request: str | None = None) -> Any:
    """A config key, written once: the dataclass field, the YAML types it accepts, what it
    means (docs/daemon.md's table holds to these), its YAML name when not the field's, and
    the PlanRequest field it becomes (models only)."""
    meta = {"types": types, "doc": doc, "yaml": yaml, "request": request}
    if isinstance(default, tuple | dict):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def yaml_keys(cls) -> dict[str, Field]:
    """A config dataclass's keys as warmd.yaml spells them."""
    return {f.metadata.get("yaml") or f.name: f for f in fields(cls) if "types" in f.metadata}


@dataclass(frozen=True)
class ModelConfig:
    """One model to keep warm; maps onto a PlanRequest made on each node."""

    path: str = _key(str, "config.json, a directory with one, or a bundled example; `~` "
                          "and `$VARS` expand **on each node**", request="model")
    name: str = _key(str, "the model's name in status and plans (default: the path's last "
                          "part)", "")
    tp: int = _key(int, "tensor parallel size", 1, request="tp")
    ep: int = _key(int, "expert parallel size", 1, request="ep")
    engine: str = _key(str, "vllm, sglang: whose kernel choices to follow", "vllm",
                       request="engine")
    mode: str | None = _key(str, "full, relax, fast: which M values to warm (default: what "
                                 "the engine's own warmup does)", None, request="mode")
    max_tokens: int | None = _key(int, "largest M (vLLM: --max-num-batched-tokens)", None,
                                  request="max_tokens")
    m_list: str | None = _key((str, list), "explicit M values instead of `mode` (a list or "
                                           "`1,2,4`)", None, request="m_list")
    target: str | None = _key(str, "GPU preset to plan for instead of the node's GPU", None,
                              request="target")
    with_libs: tuple[str, ...] = _key(list, "libraries to plan as present", (), yaml="with",
                                      request="with_libs")
    without_libs: tuple[str, ...] = _key(list, "libraries to plan as absent", (),
                                         yaml="without", request="without_libs")
    quantization: str | None = _key(str, "override the checkpoint's quantization "
                                         "(fp8_block, bf16...)", None, request="quantization")
    disable_kernels: tuple[str, ...] = _key(list, "kernels never to select", (),
                                            request="disabled_kernels")
    libraries: tuple[str, ...] = _key(list, "warm only these libraries' tasks (deep_gemm, "
                                            "flashinfer...); empty: every library", ())
    task_filter: str | None = _key(str, "warm only tasks whose key matches this regex", None)
    engine_command: tuple[str, ...] = _key((str, list), "the engine's serve command (a "
                                                        "string or a list); replaces path, "
                                                        "tp, ep, engine...", ())
    env: tuple[tuple[str, str], ...] = _key((dict, list), "the engine's environment "
                                                          "variables (VLLM_*, SGL_*..., and "
                                                          "cache ones: SGLANG_CACHE_DIR...)", (),
                                            request="engine_env")

    def plan_request(self, target: str | None = None) -> PlanRequest:
        """The plan request on this node: `~` and `$VARS` in the path expand here."""
        values = {f.metadata["request"]: getattr(self, f.name) for f in fields(self)
                  if f.metadata.get("request")}
        request = PlanRequest(**{**values, "model": expand_path(self.path),
                                 "target": self.target or target,
                                 "engine_env": self.env or None})
        if self.engine_command:
            from warmd.engines.launch import launch_request

            return launch_request([expand_path(t) for t in self.engine_command], request)
        return request


@dataclass(frozen=True)
class RedisConfig:
    url: str | None = _key(str, "`redis://`, `rediss://`, `unix://`, `redis+cluster://`; "
                                "`null`: embedded server; `off`: no shared cache", None)
    namespace: str = _key(str, "salt of every cache fingerprint and of the node records: "
                               "change it to disown a cache", "default")


@dataclass(frozen=True)
class CacheConfig:
    """Cache roots for the warmup workers, keyed as the registered libraries name them
    (deep_gemm_dir, flashinfer_workspace, vllm_cache_root...); the serving engine must use
    the same ones. A key left out keeps what the node's environment says."""

    roots: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str | None:
        return dict(self.roots).get(key)

    def env(self) -> dict[str, str]:
        """The engine variables for these roots, expanded on this node."""
        from warmd.libraries import cache_roots

        given = dict(self.roots)
        return {root.env: expand_path(given[root.config_key]) for root in cache_roots()
                if given.get(root.config_key)}

    def to_json(self) -> dict:
        from warmd.libraries import cache_roots

        given = dict(self.roots)
        return {root.config_key: given.get(root.config_key) for root in cache_roots()}


@dataclass(frozen=True)
class NodeSelector:
    """Which Ray nodes get an agent: GPU nodes matching labels and GPU types, plus nodes
    without GPUs when builders are enabled."""

    labels: tuple[tuple[str, str], ...] = _key(dict, "Ray node labels that must all match", ())
    gpu_types: tuple[str, ...] = _key(list, "Ray accelerator types (`H200`, `H100`...), "
                                            "case-insensitive; empty: any GPU", ())

    def matches(self, labels: dict[str, str], gpus: int, gpu_type: str | None,
                builders: bool) -> bool:
        if any(labels.get(k) != v for k, v in self.labels):
            return False
        if gpus <= 0:
            return builders
        if not self.gpu_types:
            return True
        return (gpu_type or "").lower() in {t.lower() for t in self.gpu_types}


@dataclass(frozen=True)
class BuilderConfig:
    """Nodes without GPUs build for `target`: FlashInfer modules, and the DeepGEMM kernels
    GPU nodes' discoveries listed (no GPU needed to compile them)."""

    enabled: bool = _key(bool, "nodes without GPUs build FlashInfer modules and listed "
                               "DeepGEMM kernels", False)
    target: str | None = _key(str, "the GPU preset builders build for", None)


@dataclass(frozen=True)
class AgentConfig:
    reconcile_seconds: float = _key((int, float), "how often the controller looks for new "
                                                  "and dead nodes (default 2)", 2.0)
    heartbeat_seconds: float = _key((int, float), "how often each agent reports health "
                                                  "(default 5)", 5.0)
    metrics_port: int = _key(int, "Prometheus endpoint of each agent (default 9464; `0`: any "
                                  "free port)", DEFAULT_METRICS_PORT)
    metrics_host: str = _key(str, "address each agent's Prometheus endpoint binds to (default "
                                  "`127.0.0.1`: this machine only; `0.0.0.0` lets a Prometheus "
                                  "elsewhere scrape it, without authentication)", LOOPBACK)


@dataclass(frozen=True)
class RayConfig:
    """The local Ray head `warmd start` starts when no cluster runs (docs/daemon.md)."""

    host: str = _key(str, "address the local Ray head binds to (default `127.0.0.1`: this "
                          "machine alone; another address lets other machines join, and turns "
                          "on Ray's token authentication)", LOOPBACK)


CAPTURE_TRUST = ("rederive", "own-nodes", "off")  # warmd.capture.watch.CaptureTrust's values


@dataclass(frozen=True)
class CaptureConfig:
    """What happens to kernels the engine compiles after READY (warmd.capture)."""

    trust: str = _key(str, "`rederive` (default): a captured entry stays a pending claim "
                           "until a node of `rederive_nodes` rebuilds it; `own-nodes`: the "
                           "capturing node publishes it signed; `off`: count, never share",
                      "rederive")
    rederive_nodes: tuple[str, ...] = _key(list, "node names (as `warmd status` shows them) "
                                                 "trusted to re-derive claims and publish "
                                                 "what they built", ())
    triton_modules: tuple[str, ...] = _key(list, "the only Python packages or modules a "
                                                 "trusted producer looks up a captured "
                                                 "Triton kernel's function in (default: "
                                                 "vllm, sglang, flashinfer)", ())


@dataclass(frozen=True)
class WarmdConfig:
    models: tuple[ModelConfig, ...] = _key(list, "the models to keep warm")
    redis: RedisConfig = _key(dict, "the shared cache", RedisConfig())
    cache: CacheConfig = _key(dict, "cache roots for the warm workers", CacheConfig())
    signing_key_file: str | None = _key(str, "HMAC key for shared-cache records (required on "
                                             "every node when set)", None)
    nodes: NodeSelector = _key(dict, "which GPU nodes get an agent", NodeSelector())
    builders: BuilderConfig = _key(dict, "nodes without GPUs", BuilderConfig())
    agent: AgentConfig = _key(dict, "the node agents", AgentConfig())
    ray: RayConfig = _key(dict, "the local Ray head", RayConfig())
    capture: CaptureConfig = _key(dict, "kernels compiled after READY", CaptureConfig())
    source: str = "<defaults>"  # where it was read (not a key)

    def to_json(self) -> dict:
        data = asdict(self)
        data["nodes"]["labels"] = dict(self.nodes.labels)
        data["cache"] = self.cache.to_json()
        return jsonable(data)

    @classmethod
    def from_json(cls, data: dict) -> WarmdConfig:
        """Inverse of to_json (configs travel between the CLI, controller and agents as JSON)."""
        source = data.get("source", "<json>")
        body = {k: v for k, v in data.items() if k != "source"}
        return replace(parse_config(_unrename(body), source), source=source)

    def work_hash(self) -> str:
        """Changes exactly when what a node warms changes: the agents re-warm on a new hash."""
        data = self.to_json()
        work = {k: data[k] for k in ("models", "cache", "signing_key_file", "builders")}
        work["redis"] = {"url": redact_url(self.redis.url), "namespace": self.redis.namespace}
        return hashlib.sha256(json.dumps(work, sort_keys=True).encode()).hexdigest()[:16]

    def public_json(self) -> dict:
        """to_json without secrets: safe to print, log and store."""
        data = self.to_json()
        data["redis"]["url"] = redact_url(self.redis.url)
        return data


def expand_path(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def redact_url(url: str | None) -> str | None:
    """A Redis URL with its password replaced: never print or store the real one."""
    from warmd.store import redact

    return redact(url) if url else url


# --- parsing and validation ---------------------------------------------------------------

_SECTIONS: dict[str, type] = {"redis": RedisConfig, "cache": CacheConfig,
                               "nodes": NodeSelector, "builders": BuilderConfig,
                               "agent": AgentConfig, "capture": CaptureConfig,
                               "ray": RayConfig}
_RENAMES = {name: f.name for name, f in yaml_keys(ModelConfig).items() if name != f.name}


def _model_keys() -> dict[str, Any]:
    return {name: f.metadata["types"] for name, f in yaml_keys(ModelConfig).items()}


def _top_keys() -> set[str]:
    return {"version", *yaml_keys(WarmdConfig)}


def schema_keys() -> dict[str, str]:
    """Every warmd.yaml key, dotted as docs/daemon.md's table names it, with its meaning."""
    out = {"version": "the config format (1)"}
    for name, top in yaml_keys(WarmdConfig).items():
        if name == "models":
            out.update({f"models[].{k}": f.metadata["doc"]
                        for k, f in yaml_keys(ModelConfig).items()})
        elif name in _SECTIONS:
            out.update({f"{name}.{k}": doc for k, doc in _section_docs(name).items()})
        else:
            out[name] = top.metadata["doc"]
    return out


def _section_docs(name: str) -> dict[str, str]:
    if name == "cache":
        from warmd.libraries import cache_roots

        return {root.config_key: f"cache root for the warm workers (`{root.env}`); `null` "
                                 "keeps the node's environment" for root in cache_roots()}
    return {k: f.metadata["doc"] for k, f in yaml_keys(_SECTIONS[name]).items()}


def _fail(where: str, message: str) -> WarmdInputError:
    return WarmdInputError(f"{where}: {message}")


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a mapping"}
    return " or ".join(names[k] for k in kinds)


def _check_type(where: str, value, kind) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    bool_mismatch = isinstance(value, bool) and bool not in kinds  # bool is an int subclass
    if bool_mismatch or not isinstance(value, kinds):
        raise _fail(where, f"expected {_type_name(kind)}, got {value!r}")


def _check_keys(where: str, data, known) -> None:
    if not isinstance(data, dict):
        raise _fail(where, f"expected a mapping, got {data!r}")
    for name in data:
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close
                    else f"known: {', '.join(sorted(known))}")
            raise _fail(where, f"unknown key {name!r} ({hint})")


def _str_list(where: str, value) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"expected a list of strings, got {value!r}")
    return tuple(value)


def _positive(where: str, value, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise _fail(where, f"must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")


def _parse_model(where: str, data) -> ModelConfig:
    from warmd.kernels.preferences import ENGINES
    from warmd.mvalues import MODES

    model_keys = _model_keys()
    _check_keys(where, data, model_keys)
    if "path" not in data and not data.get("engine_command"):
        raise _fail(where, "missing required key 'path' (or 'engine_command')")
    for name, value in data.items():
        if value is not None or name == "path":
            _check_type(f"{where}.{name}", value, model_keys[name])
    values = {_RENAMES.get(k, k): v for k, v in data.items() if v is not None}
    for key in ("engine_command", "env"):  # empty ones (as to_json writes them) are absent
        if not values.get(key, True):
            del values[key]
    if "engine_command" in values:
        values["engine_command"] = _engine_command(f"{where}.engine_command",
                                                   values["engine_command"])
        values.setdefault("path", values["engine_command"][0])
    if "env" in values:
        values["env"] = _engine_env(f"{where}.env", values["env"])
    for key in ("with_libs", "without_libs", "disable_kernels", "libraries"):
        if key in values:
            values[key] = _str_list(f"{where}.{key}", values[key])
    for key in ("tp", "ep", "max_tokens"):
        if key in values:
            _positive(f"{where}.{key}", values[key])
    if isinstance(values.get("m_list"), list):
        if not all(isinstance(m, int) and not isinstance(m, bool) and m > 0
                   for m in values["m_list"]):
            raise _fail(f"{where}.m_list", "expected positive integers")
        values["m_list"] = ",".join(str(m) for m in values["m_list"])
    if values.get("engine", "vllm") not in ENGINES:
        raise _fail(f"{where}.engine", f"unknown engine {values['engine']!r} "
                                       f"(known: {', '.join(ENGINES)})")
    if values.get("mode", "relax") not in MODES:
        raise _fail(f"{where}.mode", f"unknown mode {values['mode']!r} "
                                     f"(known: {', '.join(MODES)})")
    from warmd.libraries import LIBRARIES

    for lib in values.get("libraries", ()):
        if lib not in LIBRARIES:
            raise _fail(f"{where}.libraries", f"unknown library {lib!r} "
                                              f"(known: {', '.join(LIBRARIES)})")
    if "task_filter" in values:
        try:
            re.compile(values["task_filter"])
        except re.error as exc:
            raise _fail(f"{where}.task_filter", f"not a valid regular expression: {exc}") from None
    values.setdefault("name", Path(values["path"].rstrip("/")).name or values["path"])
    return ModelConfig(**values)


def _section_keys(name: str) -> dict[str, Any]:
    if name == "cache":
        return dict.fromkeys(_section_docs("cache"), str)
    return {k: f.metadata["types"] for k, f in yaml_keys(_SECTIONS[name]).items()}


def _engine_command(where: str, value) -> tuple[str, ...]:
    from warmd.engines.launch import parse_launch, split_command

    tokens = tuple(split_command(value)) if isinstance(value, str) else _str_list(where, value)
    try:
        parse_launch(tokens)  # checked here; the model path resolves on each node
    except WarmdInputError as exc:
        raise _fail(where, str(exc)) from None
    return tuple(tokens)


def _engine_env(where: str, value) -> tuple[tuple[str, str], ...]:
    from warmd.engines.cache_dirs import CACHE_VARIABLES
    from warmd.engines.environment import BY_NAME, EngineEnv

    if isinstance(value, list):  # [[name, value], ...] as to_json writes it
        if not all(isinstance(p, list) and len(p) == 2 for p in value):
            raise _fail(where, "expected a mapping of variable names to strings")
        value = dict(value)
    if not all(isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
               for k, v in value.items()):
        raise _fail(where, "expected a mapping of variable names to strings")
    pairs = {k: str(v) for k, v in value.items()}
    known = {*BY_NAME, "SGL_ENABLE_JIT_DEEPGEMM", *CACHE_VARIABLES}
    unknown = sorted(set(pairs) - known)
    if unknown:
        raise _fail(where, f"unknown engine variable {unknown[0]!r} (known: "
                           f"{', '.join(sorted(known))})")
    try:
        EngineEnv.of("vllm", pairs, None)
    except WarmdInputError as exc:
        raise _fail(where, str(exc)) from None
    return tuple(sorted(pairs.items()))


def _parse_section(name: str, data) -> dict:
    where = name
    if data is None:
        return {}
    keys = _section_keys(name)
    _check_keys(where, data, keys)
    out = {}
    for key, value in data.items():
        if value is None:
            continue
        _check_type(f"{where}.{key}", value, keys[key])
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
    _check_keys("config", data, _top_keys())
    if data.get("version", 1) != 1:
        raise _fail("version", f"unsupported config version {data['version']!r} (known: 1)")
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise _fail("models", "expected a non-empty list of models")
    if len(models) > MAX_MODELS:
        raise _fail("models", f"{len(models)} models, over warmd's bound of {MAX_MODELS}")
    parsed = tuple(_parse_model(f"models[{i}]", m) for i, m in enumerate(models))
    names = [m.name for m in parsed]
    if len(set(names)) != len(names):
        raise _fail("models", f"model names must be unique, got {names}")
    sections = {name: _parse_section(name, data.get(name)) for name in _SECTIONS}
    nodes = sections["nodes"]
    labels = nodes.get("labels", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise _fail("nodes.labels", "expected a mapping of strings to strings")
    agent = sections["agent"]
    for key in ("reconcile_seconds", "heartbeat_seconds"):
        if key in agent:
            _positive(f"agent.{key}", agent[key])
    if "metrics_port" in agent and not 0 <= agent["metrics_port"] <= 65535:
        raise _fail("agent.metrics_port", f"must be 0..65535, got {agent['metrics_port']}")
    capture = sections["capture"]
    if capture.get("trust", "rederive") not in CAPTURE_TRUST:
        raise _fail("capture.trust", f"unknown trust {capture['trust']!r} (known: "
                                     f"{', '.join(CAPTURE_TRUST)})")
    capture["rederive_nodes"] = _str_list("capture.rederive_nodes",
                                          capture.get("rederive_nodes", []))
    capture["triton_modules"] = _str_list("capture.triton_modules",
                                          capture.get("triton_modules", []))
    key_file = data.get("signing_key_file")
    if key_file is not None:
        _check_type("signing_key_file", key_file, str)
    return WarmdConfig(
        models=parsed,
        redis=RedisConfig(**sections["redis"]),
        cache=CacheConfig(tuple(sorted(sections["cache"].items()))),
        signing_key_file=key_file,
        nodes=NodeSelector(tuple(sorted(labels.items())),
                           _str_list("nodes.gpu_types", nodes.get("gpu_types", []))),
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


# --- loading with overrides --------------------------------------------------------------

# What a warmd.yaml may be: the example is 3 KiB and nests 4 deep; a fleet's lists many
# models. Beyond these it is refused before (depth, size) or after parsing (nodes: what its
# anchors and aliases expand to).
MAX_CONFIG_FILE_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000
MAX_MODELS = 256


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing nesting deeper than MAX_YAML_DEPTH as it composes
    (its composer recurses once per level: a deep file would end in RecursionError)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nests deeper than {MAX_YAML_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _count_nodes(data: Any, limit: int) -> bool:
    """Whether data, with every alias expanded, holds at most limit values (iteratively)."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def _load_yaml(p: Path) -> Any:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except FileNotFoundError:
        raise WarmdInputError(f"config file not found: {p}") from None
    except OSError as exc:
        raise WarmdInputError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise WarmdInputError(f"{p}: larger than {MAX_CONFIG_FILE_BYTES} bytes; not a "
                              "warmd.yaml")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise WarmdInputError(f"{p}: not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = (getattr(exc, "problem", None) or next(iter(str(exc).splitlines()), "")
                   or "invalid YAML")
        raise WarmdInputError(f"{p}: not valid YAML{where}: {problem}") from None
    if not _count_nodes(data, MAX_YAML_NODES):
        raise WarmdInputError(f"{p}: more than {MAX_YAML_NODES} values (aliases expanded); "
                              "not a warmd.yaml")
    return data


def read_config_file(path: str | Path) -> WarmdConfig:
    p = Path(path).expanduser()
    config = parse_config(_load_yaml(p), str(p))
    return replace(config, source=str(p))


def load_config(path: str | Path | None = None, *, redis_url: str | None = None,
                namespace: str | None = None, signing_key_file: str | None = None,
                metrics_port: int | None = None) -> WarmdConfig:
    """The effective config: file (flag, else WARMD_CONFIG, else the embedded default), then
    WARMD_* environment, then the keyword arguments (command-line flags)."""
    config = read_config_file(path or settings.config_path() or DEFAULT_CONFIG)
    env_port = settings.metrics_port()
    if env_port is not None and metrics_port is None:
        try:
            metrics_port = int(env_port)
        except ValueError:
            raise WarmdInputError(f"WARMD_METRICS_PORT must be a port number, "
                                  f"got {env_port!r}") from None
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise WarmdInputError(f"metrics port must be 0..65535, got {metrics_port}")
    url = redis_url or settings.redis_url() or config.redis.url
    if url and not settings.store_is_off(url):
        from warmd.store import parse_store_url

        parse_store_url(url)  # one clear line for a malformed URL, before anything starts
    ns = namespace or settings.namespace_override() or config.redis.namespace
    key_file = signing_key_file or settings.signing_key_file() or config.signing_key_file
    agent = config.agent if metrics_port is None else replace(config.agent,
                                                              metrics_port=metrics_port)
    return replace(config, redis=RedisConfig(url, ns), signing_key_file=key_file, agent=agent)
