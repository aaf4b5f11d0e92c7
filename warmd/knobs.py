"""Every knob warmd reads from the environment, in one table, with the engines' own names.

``KNOBS`` is the reference (README's Environment table follows it; a test holds them equal):
each knob has its variable, a type, its default (here and nowhere else) and a line of
documentation, and ``Knob.get`` is the only place in warmd that reads the environment.

Code that names a variable reads it through its accessor in warmd.settings
(``settings.state_dir()``); ``get(env)`` here is for code that holds a variable's name as
data (a library's cache root, an engine's variables). A test holds warmd to that.
Every read takes the variables it reads from: this process's environment by default, or a
node's own (``warmd.context.NodeContext.environ``), so that two nodes' work in one process
never sees each other's; warmd writes variables only into child processes' environments.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Knob types: how a set value is read. An unset or empty variable always means the default.
STRING, PATH, NUMBER, FLAG, NAMES = "string", "path", "positive number", "flag", "names"
WHOLE = "whole number"  # 0, 1, 2...
_FALSE = ("0", "false")


@dataclass(frozen=True)
class Knob:
    """One environment variable warmd reads."""

    env: str
    kind: str  # STRING, PATH, NUMBER (positive), WHOLE (0, 1...), FLAG (0/false: off) or
    # NAMES (a,b,c)
    default: Any  # the value when unset, or a function computing it from a reader of other
    # knobs (``lambda read: read("XDG_CACHE_HOME") / "warmd"``), in the same variables
    doc: str
    empty_is_unset: bool = True  # False: an empty value means something (no GPU visible)

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text in environ (default: this process's environment) when set
        (and non-empty, unless empty means something)."""
        value = (os.environ if environ is None else environ).get(self.env)
        return value if value or (value is not None and not self.empty_is_unset) else None

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        raw = self.raw(environ)
        if raw is None:
            if callable(self.default):
                return self.default(lambda env: get(env, environ))
            return self.default
        return _PARSERS[self.kind](self.env, raw)


def _number(var: str, raw: str) -> float:
    from warmd.errors import WarmdInputError

    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise WarmdInputError(f"{var} must be a positive number, got {raw!r}")
    return value


def _whole(var: str, raw: str) -> int:
    from warmd.errors import WarmdInputError

    if not raw.strip().isdigit():
        raise WarmdInputError(f"{var} must be a whole number (0, 1, 2...), got {raw!r}")
    return int(raw)


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    WHOLE: _whole,
    STRING: lambda _var, raw: raw,
    PATH: lambda _var, raw: Path(raw),
    NUMBER: _number,
    FLAG: lambda _var, raw: raw.strip().lower() not in _FALSE,
    NAMES: lambda _var, raw: tuple(n.strip() for n in raw.split(",") if n.strip()),
}



def home() -> Path:
    """This user's home (what `~` expands to)."""
    return Path(os.path.expanduser("~"))


def _engine(env: str, doc: str, default: str | None = None) -> Knob:
    """A variable of an engine or toolchain that warmd reads only to put into a cache
    fingerprint (it changes the compiler's command or its cache key)."""
    return Knob(env, STRING, default, doc)


# DeepGEMM knobs that change its compiler signature or flags, hence every kernel's cache key
# (DeepJIT, the 2.8 / sgl-deep-gemm 0.2 JIT, also reads each DG_JIT_X as DJ_JIT_X).
_DEEP_JIT_KEY_ENV = ("JIT_NVCC_COMPILER", "JIT_CPP_STANDARD", "JIT_WITH_LINEINFO", "JIT_DEBUG",
                     "JIT_PTXAS_VERBOSE", "JIT_CHECK_NO_SPILLS", "JIT_CHECK_NO_LOCAL_MEMORY")
DEEP_GEMM_KEY_ENV = ("DG_JIT_USE_NVRTC", "DG_JIT_PTXAS_CHECK",
                     *(f"{prefix}_{name}" for prefix in ("DG", "DJ") for name in _DEEP_JIT_KEY_ENV))
# Env knobs FlashInfer copies into the build commands (cpp_ext.py, core.py).
FLASHINFER_COMMAND_ENV = ("CC", "CXX", "CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC",
                          "FLASHINFER_CXX_LAUNCHER", "FLASHINFER_NVCC_LAUNCHER",
                          "FLASHINFER_NVCC_THREADS", "FLASHINFER_EXTRA_CFLAGS",
                          "FLASHINFER_EXTRA_CUDAFLAGS", "FLASHINFER_EXTRA_LDFLAGS",
                          "FLASHINFER_JIT_DEBUG", "FLASHINFER_JIT_VERBOSE",
                          "FLASHINFER_JIT_LINEINFO")
# The serving engines' own variables that change what they compile (warmd.engines.environment
# holds their types, defaults per release and sources; docs/selection.md their rules): read
# through this table like every other variable, handed to the planner as the engine reads them.
ENGINE_KERNEL_ENV = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0",
                     "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "VLLM_USE_FLASHINFER_SAMPLER",
                     "VLLM_DEEP_GEMM_WARMUP", "VLLM_ATTENTION_BACKEND",
                     "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_FLASHINFER_MOE_BACKEND",
                     "VLLM_FUSED_MOE_CHUNK_SIZE", "VLLM_DISABLED_KERNELS", "VLLM_BATCH_INVARIANT",
                     "SGLANG_ENABLE_JIT_DEEPGEMM", "SGL_ENABLE_JIT_DEEPGEMM",
                     "SGLANG_JIT_DEEPGEMM_PRECOMPILE", "SGLANG_JIT_DEEPGEMM_FAST_WARMUP")
_TOOLCHAIN = {
    "CC": "C compiler FlashInfer's commands use (in the FlashInfer fingerprint)",
    "CXX": "C++ compiler (default `c++`): FlashInfer's commands, the fingerprint, the "
           "libcuda link check",
    "CUDA_HOME": "CUDA toolkit root (default: `/usr/local/cuda` when it holds nvcc, else the "
                 "toolkit of the nvcc on PATH)",
    "CUDA_PATH": "CUDA toolkit root when CUDA_HOME is unset",
}
_TOOLCHAIN_DEFAULTS = {"CXX": "c++"}

KNOBS: tuple[Knob, ...] = (
    # warmd's own
    Knob("WARMD_STATE_DIR", PATH, lambda read: read("XDG_CACHE_HOME") / "warmd",
         "warmd's own state: embedded Redis data, logs (default `$XDG_CACHE_HOME/warmd`)"),
    Knob("WARMD_REDIS_URL", STRING, None,
         "shared cache (`redis://`, `rediss://`, `unix://`, a Redis Cluster URL; `off`, "
         "`none` or `disabled`: no shared cache); unset: the embedded server"),
    Knob("WARMD_NAMESPACE", STRING, "default",
         "salt of every fingerprint (default `default`): change it to disown a whole set of "
         "entries; overrides the config file's `redis.namespace`"),
    Knob("WARMD_SIGNING_KEY_FILE", PATH, None,
         "file holding the HMAC key for manifests; when set, unsigned entries are refused"),
    Knob("WARMD_SIGNING_KEY", STRING, None, "the HMAC key itself (the file wins when both "
                                            "are set); moved into a 0600 file before any "
                                            "child starts"),
    Knob("WARMD_MAX_ARTIFACT_BYTES", NUMBER, 256 * 1024 * 1024,
         "largest artifact packed, fetched or unpacked (default 256 MiB)"),
    Knob("WARMD_CACHE_TTL_DAYS", NUMBER, 30.0,
         "shared entries expire this long after their last use (default 30)"),
    Knob("WARMD_REDIS_TIMEOUT", NUMBER, 2.0,
         "bound on one shared-cache operation, in seconds (default 2)"),
    Knob("WARMD_REDIS_JOIN_BUDGET", NUMBER, 60.0,
         "how long in all a warmup retries a slow shared cache (timeouts, with backoff and "
         "jitter) before it compiles locally, in seconds (default 60)"),
    Knob("WARMD_SINGLE_FLIGHT_TIMEOUT", NUMBER, 3600.0,
         "the longest a warmup waits on a claim another node holds (a task's lease, a "
         "kernel, a discovery, a kernel list) before it builds the work itself, in seconds "
         "(default 3600)"),
    Knob("WARMD_TASK_TIMEOUT", NUMBER, 3600.0,
         "the longest one piece of compile work runs (a task in a worker process, a piece "
         "of discovery, one nvcc run of a kernel stage) before it is killed, with what it "
         "started, and fails, in seconds (default 3600)"),
    Knob("WARMD_NODE_NAME", STRING, None,
         "this node's name in stats, manifests and `warmd status` (default: `<host>-<8 hex>`, "
         "kept in `<state dir>/node-id`)"),
    Knob("WARMD_EMBEDDED_MAXMEMORY", STRING, "4gb",
         "maxmemory of the embedded Redis (default `4gb`; `0`: no limit)"),
    Knob("WARMD_COMPILE_NICE", WHOLE, 10,
         "nice increment of the nvcc runs of DeepGEMM's kernel stage (default 10), so its "
         "discovery, the engine and serving keep the CPU first; `0`: none"),
    Knob("WARMD_DISCOVERY_PROCESSES", WHOLE, 2,
         "discovery processes of a kernel stage while it records (default 2; at most one "
         "per two compile jobs; `0`: one), each holding a CUDA context"),
    Knob("WARMD_CONFIG", PATH, None,
         "the daemon's warmd.yaml (default: the embedded example config)"),
    Knob("WARMD_METRICS_PORT", STRING, None,
         "port of each node agent's Prometheus endpoint (`0`: any free port; default 9464)"),
    Knob("WARMD_DISABLED_KERNELS", NAMES, (), "comma-separated kernel names never to select"),
    Knob("WARMD_TRITON_MODULES", NAMES, ("vllm", "sglang", "flashinfer"),
         "the only Python packages or modules a trusted producer looks up a captured Triton "
         "kernel's function in (default `vllm,sglang,flashinfer`, those importable; "
         "warmd.yaml `capture.triton_modules`)"),
    Knob("WARMD_LIBRARY_PACKAGES", NAMES, (),
         "more Python packages, each registering a JIT library kept outside warmd (a "
         "`LIBRARY` like `warmd/libraries/<name>/`)"),
    # the engines' and libraries' own
    Knob("XDG_CACHE_HOME", PATH, lambda _read: home() / ".cache",
         "user cache root (default `~/.cache`)"),
    Knob("VLLM_CACHE_ROOT", PATH, lambda read: read("XDG_CACHE_HOME") / "vllm",
         "vLLM's cache root (default `$XDG_CACHE_HOME/vllm`)"),
    Knob("HF_HOME", PATH, lambda read: read("XDG_CACHE_HOME") / "huggingface",
         "Hugging Face home (default `$XDG_CACHE_HOME/huggingface`): models given as hub ids "
         "resolve in its `hub/` cache"),
    Knob("HF_HUB_CACHE", PATH,
         lambda read: read("HUGGINGFACE_HUB_CACHE") or read("HF_HOME") / "hub",
         "Hugging Face hub cache (default `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`; "
         "warmd never downloads)"),
    Knob("HUGGINGFACE_HUB_CACHE", PATH, None, "older name of `HF_HUB_CACHE`"),
    Knob("DG_JIT_CACHE_DIR", PATH, lambda read: read("VLLM_CACHE_ROOT") / "deep_gemm",
         "DeepGEMM's cache root (vLLM: default `$VLLM_CACHE_ROOT/deep_gemm`; SGLang "
         "overwrites it with `$SGLANG_DG_CACHE_DIR`)"),
    Knob("SGLANG_CACHE_DIR", PATH, lambda _read: home() / ".cache" / "sglang",
         "SGLang's cache root (default `~/.cache/sglang`): `import sglang` defaults "
         "`TRITON_CACHE_DIR` and `FLASHINFER_WORKSPACE_BASE` under it"),
    Knob("SGLANG_DG_CACHE_DIR", PATH, None,
         "SGLang's DeepGEMM cache (default `$SGLANG_CACHE_DIR/deep_gemm`), forced into "
         "`DG_JIT_CACHE_DIR`"),
    *(_engine(env, "DeepGEMM compiler knob (in the DeepGEMM fingerprint)")
      for env in DEEP_GEMM_KEY_ENV),
    Knob("FLASHINFER_WORKSPACE_BASE", PATH, lambda _read: home(),
         "FlashInfer's workspace (default `~`; modules under `.cache/flashinfer/`)"),
    Knob("FLASHINFER_CUDA_ARCH_LIST", STRING, None,
         "arch FlashInfer builds for (default: the plan's target)"),
    *(_engine(env, _TOOLCHAIN.get(env, "FlashInfer build knob (in the FlashInfer "
                                       "fingerprint)"), _TOOLCHAIN_DEFAULTS.get(env))
      for env in FLASHINFER_COMMAND_ENV),
    Knob("FLASHINFER_AUTOTUNE_CACHE_DIR", PATH,
         lambda read: read("FLASHINFER_WORKSPACE_BASE") / ".cache" / "flashinfer" / "autotune",
         "FlashInfer's managed autotune store (default "
         "`$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/autotune`): captured and shared"),
    Knob("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", PATH, None,
         "vLLM's FlashInfer autotune results (default "
         "`$VLLM_CACHE_ROOT/flashinfer_autotune_cache/<version>/<arch>`): captured and shared"),
    Knob("TRITON_HOME", PATH, lambda _read: home(), "Triton's home (default `~`)"),
    Knob("TRITON_CACHE_DIR", PATH, lambda read: read("TRITON_HOME") / ".triton" / "cache",
         "Triton's kernel cache (default `$TRITON_HOME/.triton/cache`): captured and shared"),
    Knob("CUDA_VISIBLE_DEVICES", STRING, None, "GPUs warmd may use, one per worker (set "
         "and empty: none)", empty_is_unset=False),
    Knob("LIBRARY_PATH", STRING, None,
         "linker search path; a FlashInfer worker gets warmd's stub libcuda prepended"),
    Knob("CPATH", STRING, None,
         "header search path; a FlashInfer worker gets curand's headers prepended"),
    Knob("MAX_JOBS", NUMBER, None, "compile jobs one ninja build runs at once (FlashInfer "
         "reads it; default: warmd shares the node's cores among its workers)"),
    *(_engine(env, "the serving engine's own variable, read as the engine reads it (rules "
                   "and defaults per release: docs/selection.md)") for env in ENGINE_KERNEL_ENV),
    Knob("COLUMNS", STRING, None, "width tables render for (default: the terminal's, else 120)"),
    Knob("RAY_ADDRESS", STRING, None, "the Ray cluster warmd's daemon commands talk to"),
    Knob("RAY_AUTH_MODE", STRING, None, "Ray's authentication (`token`: every Ray process "
                                        "and client presents the cluster's token; a head "
                                        "`warmd start` starts off loopback turns it on)"),
)
_BY_ENV = {knob.env: knob for knob in KNOBS}


def get(env: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the knob for this variable in environ (default: this process's
    environment), its default when unset; for a variable named in code, call its accessor
    (or the node context's) instead."""
    return _BY_ENV[env].get(environ)


def is_set(env: str, environ: Mapping[str, str] | None = None) -> bool:
    return _BY_ENV[env].raw(environ) is not None


def present(names: tuple[str, ...], environ: Mapping[str, str] | None = None
            ) -> dict[str, str]:
    """The variables among names that are set, with their text (for fingerprints)."""
    return {name: raw for name in names if (raw := _BY_ENV[name].raw(environ)) is not None}
