"""The daemon's configuration, typed: what warmd.yaml may say (every key written once, with
its YAML types and meaning), the values a parsed file becomes, and the schema docs/daemon.md's
table holds to.

Reading a file is warmd.config.load (bounds, WARMD_* environment, flags); checking what it
says is warmd.config.parse (one line naming the bad field) with the field checks of
warmd.config.validate. What only a node can check (does the model path exist there? is there
a GPU?) is checked by that node's agent, which turns a problem into that node's FAILED state
instead of stopping the whole cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any

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


SECTIONS: dict[str, type] = {"redis": RedisConfig, "cache": CacheConfig,
                             "nodes": NodeSelector, "builders": BuilderConfig,
                             "agent": AgentConfig, "capture": CaptureConfig,
                             "ray": RayConfig}


def schema_keys() -> dict[str, str]:
    """Every warmd.yaml key, dotted as docs/daemon.md's table names it, with its meaning."""
    out = {"version": "the config format (1)"}
    for name, top in yaml_keys(WarmdConfig).items():
        if name == "models":
            out.update({f"models[].{k}": f.metadata["doc"]
                        for k, f in yaml_keys(ModelConfig).items()})
        elif name in SECTIONS:
            out.update({f"{name}.{k}": doc for k, doc in section_docs(name).items()})
        else:
            out[name] = top.metadata["doc"]
    return out


def section_docs(name: str) -> dict[str, str]:
    if name == "cache":
        from warmd.libraries import cache_roots

        return {root.config_key: f"cache root for the warm workers (`{root.env}`); `null` "
                                 "keeps the node's environment" for root in cache_roots()}
    return {k: f.metadata["doc"] for k, f in yaml_keys(SECTIONS[name]).items()}

