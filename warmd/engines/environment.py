"""The engine's own environment variables that change which kernels it JIT-compiles.

They are inputs of the engine, not knobs of warmd: a plan reads them from a dict (the process
environment, read here in one place, overlaid with `env:` of warmd.yaml). Each variable is a row:
its engine, its type, its default per engine version, and the source file that defines it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from warmd.engines.versions import ALL_VERSIONS, Version, VersionRange
from warmd.errors import WarmdInputError

VLLM_ENVS = "vllm/envs.py"
SGLANG_ENVS = "python/sglang/srt/environ.py"


@dataclass(frozen=True)
class EngineVariable:
    name: str
    engine: str
    kind: str  # bool | int | choice | list
    defaults: tuple[tuple[VersionRange, str], ...]
    source: str
    choices: tuple[str, ...] = ()

    def default(self, version: Version | None) -> str:
        for versions, value in self.defaults:
            if versions.contains(version):
                return value
        return self.defaults[-1][1]


def _var(name: str, engine: str, kind: str, default: str, source: str,
         choices: tuple[str, ...] = (), defaults=None) -> EngineVariable:
    return EngineVariable(name, engine, kind, defaults or ((ALL_VERSIONS, default),), source,
                          choices)


VARIABLES: tuple[EngineVariable, ...] = (
    # vLLM turned DeepGEMM on by default in 0.11.0 (vllm-project/vllm PR #24462).
    _var("VLLM_USE_DEEP_GEMM", "vllm", "bool", "1", VLLM_ENVS, defaults=(
        (VersionRange(None, (0, 11, 0)), "0"), (VersionRange((0, 11, 0), None), "1"))),
    _var("VLLM_MOE_USE_DEEP_GEMM", "vllm", "bool", "1", VLLM_ENVS),
    _var("VLLM_USE_DEEP_GEMM_E8M0", "vllm", "bool", "1", VLLM_ENVS),
    _var("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "vllm", "bool", "1", VLLM_ENVS),
    _var("VLLM_USE_FLASHINFER_SAMPLER", "vllm", "bool", "", VLLM_ENVS),
    _var("VLLM_DEEP_GEMM_WARMUP", "vllm", "choice", "relax", VLLM_ENVS,
         ("skip", "full", "relax")),
    # Read until 0.15.x (vllm/config/attention.py); 0.16.0 dropped it for --attention-backend.
    _var("VLLM_ATTENTION_BACKEND", "vllm", "choice", "", VLLM_ENVS, (
        "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLASHMLA", "FLASHINFER_MLA",
        "CUTLASS_MLA", "TRITON_MLA", "FLASH_ATTN_MLA")),
    # Read by the FP8 MoE backend choice until 0.23.x (warmd/engines/moe_backends.py); the
    # backend's default moved from throughput (0.11.0) to latency (0.12.0 and later).
    _var("VLLM_USE_FLASHINFER_MOE_FP8", "vllm", "bool", "0", VLLM_ENVS),
    _var("VLLM_FLASHINFER_MOE_BACKEND", "vllm", "choice", "latency", VLLM_ENVS,
         ("throughput", "latency", "masked_gemm"), defaults=(
             (VersionRange(None, (0, 12, 0)), "throughput"),
             (VersionRange((0, 12, 0), None), "latency"))),
    _var("VLLM_FUSED_MOE_CHUNK_SIZE", "vllm", "int", str(16 * 1024), VLLM_ENVS),
    _var("VLLM_DISABLED_KERNELS", "vllm", "list", "", VLLM_ENVS),
    # Triton MoE and block-FP8 GEMMs run one default config (fused_moe.py get_moe_configs).
    _var("VLLM_BATCH_INVARIANT", "vllm", "bool", "0", VLLM_ENVS),
    _var("SGLANG_ENABLE_JIT_DEEPGEMM", "sglang", "bool", "1", SGLANG_ENVS),
    _var("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "sglang", "bool", "1", SGLANG_ENVS),
    _var("SGLANG_JIT_DEEPGEMM_FAST_WARMUP", "sglang", "bool", "0", SGLANG_ENVS),
)
BY_NAME = {v.name: v for v in VARIABLES}
# Older SGLang spelled these SGL_*; its environ.py still honours the old names.
ALIASES = {"SGL_ENABLE_JIT_DEEPGEMM": "SGLANG_ENABLE_JIT_DEEPGEMM"}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def process_engine_env(node_environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine variables of a node's variables (default: this process's environment),
    read through warmd's one knob table (knobs.ENGINE_KERNEL_ENV)."""
    from warmd import settings

    environ = settings.engine_kernel_env(node_environ)
    found = {name: environ[name] for name in BY_NAME if name in environ}
    for old, new in ALIASES.items():
        if old in environ and new not in found:
            found[new] = environ[old]
    return found


@dataclass(frozen=True)
class EngineEnv:
    """The engine variables a plan sees, and the engine version their defaults follow."""

    engine: str
    values: tuple[tuple[str, str], ...] = ()
    version: Version | None = None

    @classmethod
    def of(cls, engine: str, values: Mapping[str, str], version: Version | None) -> EngineEnv:
        known = {ALIASES.get(k, k): str(v) for k, v in values.items()}
        for name, value in known.items():
            if name in BY_NAME:
                _parse(BY_NAME[name], value)  # a bad value is bad input now, not later
        return cls(engine, tuple(sorted(known.items())), version)

    def is_set(self, name: str) -> bool:
        return name in dict(self.values) and BY_NAME[name].engine == self.engine

    def raw(self, name: str) -> str:
        value = dict(self.values).get(name)
        if value is None or BY_NAME[name].engine != self.engine:
            return BY_NAME[name].default(self.version)
        return value

    def get(self, name: str):
        return _parse(BY_NAME[name], self.raw(name))


def _parse(var: EngineVariable, value: str):
    text = value.strip()
    if var.kind == "bool":
        if text == "":
            return None
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise WarmdInputError(f"{var.name} must be 0 or 1, got {value!r}")
    if var.kind == "int":
        from warmd.engines.launch import positive_int

        return positive_int(var.name, text)
    if var.kind == "choice":
        if text and text not in var.choices:
            raise WarmdInputError(f"{var.name}={value!r} is not one of "
                                  f"{', '.join(var.choices)}")
        return text or None
    return tuple(part.strip() for part in text.split(",") if part.strip())
