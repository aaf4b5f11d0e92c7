"""Every knob warmd reads from the environment, in one table, with the engines' own names.

``KNOBS`` is the reference (README's Environment table follows it; a test holds them equal):
each knob has its variable, a type, its default (here and nowhere else) and a line of
documentation, and ``Knob.get`` is the only place in warmd that reads the environment.

One way to read a knob: code that names a variable calls its accessor below
(``settings.state_dir()``), which is ``get(ENV)`` and nothing more, or a value derived
from several knobs (``cuda_home()``); ``get(env)`` itself is for code that holds a
variable's name as data (a library's cache root, an engine's variables). A test holds warmd
to that. Writing variables for child processes (worker environments) happens elsewhere;
reading never does.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator
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
    default: Any  # the value when unset, or a function of nothing computing it
    doc: str
    empty_is_unset: bool = True  # False: an empty value means something (no GPU visible)

    def raw(self) -> str | None:
        """The variable's text when set (and non-empty, unless empty means something)."""
        value = os.environ.get(self.env)
        return value if value or (value is not None and not self.empty_is_unset) else None

    def get(self) -> Any:
        raw = self.raw()
        if raw is None:
            return self.default() if callable(self.default) else self.default
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


def _home() -> Path:
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
    Knob("WARMD_STATE_DIR", PATH, lambda: xdg_cache_home() / "warmd",
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
    Knob("WARMD_NODE_NAME", STRING, None,
         "this node's name in stats, manifests and `warmd status` (default: `<host>-<8 hex>`, "
         "kept in `<state dir>/node-id`)"),
    Knob("WARMD_EMBEDDED_MAXMEMORY", STRING, "4gb",
         "maxmemory of the embedded Redis (default `4gb`; `0`: no limit)"),
    Knob("WARMD_COMPILE_NICE", WHOLE, 10,
         "nice increment of the nvcc runs of DeepGEMM's kernel stage (default 10), so its "
         "discovery, the engine and serving keep the CPU first; `0`: none"),
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
    Knob("XDG_CACHE_HOME", PATH, lambda: _home() / ".cache", "user cache root (default "
                                                              "`~/.cache`)"),
    Knob("VLLM_CACHE_ROOT", PATH, lambda: xdg_cache_home() / "vllm",
         "vLLM's cache root (default `$XDG_CACHE_HOME/vllm`)"),
    Knob("HF_HOME", PATH, lambda: xdg_cache_home() / "huggingface",
         "Hugging Face home (default `$XDG_CACHE_HOME/huggingface`): models given as hub ids "
         "resolve in its `hub/` cache"),
    Knob("HF_HUB_CACHE", PATH, lambda: get("HUGGINGFACE_HUB_CACHE") or get("HF_HOME") / "hub",
         "Hugging Face hub cache (default `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`; "
         "warmd never downloads)"),
    Knob("HUGGINGFACE_HUB_CACHE", PATH, None, "older name of `HF_HUB_CACHE`"),
    Knob("DG_JIT_CACHE_DIR", PATH, lambda: vllm_cache_root() / "deep_gemm",
         "DeepGEMM's cache root (vLLM: default `$VLLM_CACHE_ROOT/deep_gemm`; SGLang "
         "overwrites it with `$SGLANG_DG_CACHE_DIR`)"),
    Knob("SGLANG_CACHE_DIR", PATH, lambda: _home() / ".cache" / "sglang",
         "SGLang's cache root (default `~/.cache/sglang`): `import sglang` defaults "
         "`TRITON_CACHE_DIR` and `FLASHINFER_WORKSPACE_BASE` under it"),
    Knob("SGLANG_DG_CACHE_DIR", PATH, None,
         "SGLang's DeepGEMM cache (default `$SGLANG_CACHE_DIR/deep_gemm`), forced into "
         "`DG_JIT_CACHE_DIR`"),
    *(_engine(env, "DeepGEMM compiler knob (in the DeepGEMM fingerprint)")
      for env in DEEP_GEMM_KEY_ENV),
    Knob("FLASHINFER_WORKSPACE_BASE", PATH, _home,
         "FlashInfer's workspace (default `~`; modules under `.cache/flashinfer/`)"),
    Knob("FLASHINFER_CUDA_ARCH_LIST", STRING, None,
         "arch FlashInfer builds for (default: the plan's target)"),
    *(_engine(env, _TOOLCHAIN.get(env, "FlashInfer build knob (in the FlashInfer "
                                       "fingerprint)"), _TOOLCHAIN_DEFAULTS.get(env))
      for env in FLASHINFER_COMMAND_ENV),
    Knob("FLASHINFER_AUTOTUNE_CACHE_DIR", PATH,
         lambda: flashinfer_workspace_base() / ".cache" / "flashinfer" / "autotune",
         "FlashInfer's managed autotune store (default "
         "`$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/autotune`): captured and shared"),
    Knob("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", PATH, None,
         "vLLM's FlashInfer autotune results (default "
         "`$VLLM_CACHE_ROOT/flashinfer_autotune_cache/<version>/<arch>`): captured and shared"),
    Knob("TRITON_HOME", PATH, _home, "Triton's home (default `~`)"),
    Knob("TRITON_CACHE_DIR", PATH, lambda: get("TRITON_HOME") / ".triton" / "cache",
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


def get(env: str) -> Any:
    """The value of the knob for this variable (its default when unset); for a variable
    named in code, call its accessor instead."""
    return _BY_ENV[env].get()


def is_set(env: str) -> bool:
    return _BY_ENV[env].raw() is not None


def present(names: tuple[str, ...]) -> dict[str, str]:
    """The variables among names that are set, with their text (for fingerprints)."""
    return {name: raw for name in names if (raw := _BY_ENV[name].raw()) is not None}


# The environment is the process's, and an agent's threads (capture, re-derivation) each
# hold a scope of the node's env at once: a variable stays set while any scope that set it
# is open, and only the last one to close puts back what was there before the first.
_SCOPES_LOCK = threading.Lock()
_OPEN_SCOPES: list[dict[str, str]] = []
_BEFORE_SCOPES: dict[str, str | None] = {}


@contextlib.contextmanager
def scoped_env(env: dict[str, str]) -> Iterator[None]:
    """Set variables for the duration of a block, then restore what was there; safe when
    scopes of several threads overlap (a variable keeps the newest open scope's value)."""
    scope = dict(env)
    with _SCOPES_LOCK:
        for key in scope:
            if not any(key in other for other in _OPEN_SCOPES):
                _BEFORE_SCOPES[key] = os.environ.get(key)
        _OPEN_SCOPES.append(scope)
        os.environ.update(scope)
    try:
        yield
    finally:
        with _SCOPES_LOCK:
            del _OPEN_SCOPES[next(i for i, o in enumerate(_OPEN_SCOPES) if o is scope)]
            for key in scope:
                holder = next((o for o in reversed(_OPEN_SCOPES) if key in o), None)
                if holder is not None:
                    os.environ[key] = holder[key]
                    continue
                before = _BEFORE_SCOPES.pop(key, None)
                if before is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = before


# ----- named accessors -----

def home() -> Path:
    """This user's home (what `~` expands to)."""
    return _home()


def xdg_cache_home() -> Path:
    return get("XDG_CACHE_HOME")


def state_dir() -> Path:
    """warmd's own state: embedded Redis data, logs, local task records."""
    return get("WARMD_STATE_DIR")


def vllm_cache_root() -> Path:
    return get("VLLM_CACHE_ROOT")


def deep_gemm_cache_dir() -> Path:
    """Where DeepGEMM reads and writes kernels: DG_JIT_CACHE_DIR as the engine sets it
    (vLLM: $VLLM_CACHE_ROOT/deep_gemm), taken as one path. sgl-deep-gemm 0.1.4.post1 has no
    lookup list: with DG_JIT_CACHE_DIR=A:B it compiles into a directory literally named
    'A:B' and reads nothing from B (measured on an H200, docs/benchmarks.md)."""
    return get("DG_JIT_CACHE_DIR")


def engine_kernel_env() -> dict[str, str]:
    """The engines' own kernel-changing variables that are set, with their text."""
    return present(ENGINE_KERNEL_ENV)


def deep_gemm_key_env() -> dict[str, str]:
    return present(DEEP_GEMM_KEY_ENV)


def flashinfer_workspace_base() -> Path:
    """FlashInfer caches under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default: ~)."""
    return get("FLASHINFER_WORKSPACE_BASE")


def flashinfer_autotune_dir() -> Path:
    return get("FLASHINFER_AUTOTUNE_CACHE_DIR")


def triton_cache_dir() -> Path:
    return get("TRITON_CACHE_DIR")


def flashinfer_arch_list() -> str | None:
    """FLASHINFER_CUDA_ARCH_LIST when the operator set it (it wins over the plan's target)."""
    return get("FLASHINFER_CUDA_ARCH_LIST")


def cxx() -> str:
    return get("CXX")


def cuda_home() -> Path:
    """The CUDA toolkit root torch and FlashInfer use: CUDA_HOME/CUDA_PATH, else
    /usr/local/cuda when it holds nvcc, else the toolkit around the nvcc on PATH (which may
    be a wrapper script, hence last; FlashInfer's own guess, dirname(dirname(which nvcc)),
    is wrong for one in /usr/local/bin), else /usr/local/cuda. The directory may hold no
    toolkit: whoever needs nvcc checks ``cuda_home() / "bin" / "nvcc"``."""
    explicit = get("CUDA_HOME") or get("CUDA_PATH")
    if explicit:
        return Path(explicit)
    default = Path("/usr/local/cuda")
    nvcc = shutil.which("nvcc")
    if (default / "bin" / "nvcc").exists() or not nvcc:
        return default
    return Path(nvcc).resolve().parent.parent


def visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as set (None: every GPU is visible; empty: none is)."""
    return get("CUDA_VISIBLE_DEVICES")


def visible_gpu_ids() -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES parsed (the one place that does): its ids (indices or UUIDs)
    in order; None when unset (every GPU is visible), () when set and empty (none is)."""
    visible = visible_devices()
    if visible is None:
        return None
    return tuple(part.strip() for part in visible.split(",") if part.strip())


def disabled_kernels() -> frozenset[str]:
    """WARMD_DISABLED_KERNELS (the engine's own VLLM_DISABLED_KERNELS is an engine variable:
    warmd.engines.environment)."""
    return frozenset(get("WARMD_DISABLED_KERNELS"))


def hub_cache_dir() -> Path:
    """huggingface_hub's cache: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub."""
    return get("HF_HUB_CACHE").expanduser()


def columns() -> str:
    return (get("COLUMNS") or "").strip()


def ray_address() -> str | None:
    return get("RAY_ADDRESS")


def ray_auth_mode() -> str:
    """RAY_AUTH_MODE, lowercased ("" when unset)."""
    return (get("RAY_AUTH_MODE") or "").lower()


def redis_url() -> str | None:
    return get("WARMD_REDIS_URL")


STORE_OFF = ("off", "none", "disabled")


def store_is_off(url: str | None) -> bool:
    """Whether a store URL (flag, variable or config) says: no shared cache at all."""
    return bool(url) and url.strip().lower() in STORE_OFF


def namespace() -> str:
    """Salt of every shared-cache fingerprint: change it to disown a whole set of entries."""
    return get("WARMD_NAMESPACE")


def namespace_override() -> str | None:
    """WARMD_NAMESPACE when set (the daemon's config file is overridden only then)."""
    return namespace() if is_set("WARMD_NAMESPACE") else None


# WARMD_SIGNING_KEY=<this><path>: the key was moved into that 0600 file (warmd.store.credentials)
SECRET_FILE_PREFIX = "warmd-secret-file:"


def signing_key_file() -> str | None:
    path = get("WARMD_SIGNING_KEY_FILE")
    return str(path) if path else None


def signing_key_text() -> str | None:
    """WARMD_SIGNING_KEY as set: the key, or where it was moved (SECRET_FILE_PREFIX)."""
    return get("WARMD_SIGNING_KEY")


def signing_key() -> bytes | None:
    """HMAC key for manifests, from WARMD_SIGNING_KEY_FILE or WARMD_SIGNING_KEY."""
    path = signing_key_file()
    if path:
        return Path(path).read_bytes().strip()
    value = signing_key_text()
    if value and value.startswith(SECRET_FILE_PREFIX):  # moved out of the environment
        return Path(value[len(SECRET_FILE_PREFIX):]).read_bytes().strip()
    return value.encode() if value else None


def max_artifact_bytes() -> int:
    return int(get("WARMD_MAX_ARTIFACT_BYTES"))


def cache_ttl_seconds() -> int:
    """Shared-cache entries expire this long after their last use (WARMD_CACHE_TTL_DAYS)."""
    return int(get("WARMD_CACHE_TTL_DAYS") * 86400)


def redis_timeout() -> float:
    """Bound on one shared-cache operation, in seconds (WARMD_REDIS_TIMEOUT)."""
    return get("WARMD_REDIS_TIMEOUT")


def redis_join_budget() -> float:
    """How long in all a warmup retries a slow shared cache (WARMD_REDIS_JOIN_BUDGET)."""
    return get("WARMD_REDIS_JOIN_BUDGET")


def single_flight_timeout() -> float:
    """The longest a warmup waits on another node's claim (WARMD_SINGLE_FLIGHT_TIMEOUT)."""
    return get("WARMD_SINGLE_FLIGHT_TIMEOUT")


def node_name() -> str:
    """This machine's stable name in node records, `warmd status` and shared-cache stats:
    WARMD_NODE_NAME, else <state dir>/node-id, written once as <host>-<8 hex> from the machine
    id and the state dir (so restarts keep it, and two state dirs on one host differ)."""
    import hashlib
    import socket
    import uuid

    if get("WARMD_NODE_NAME"):  # an accessor's own variable (node_name is its accessor)
        return get("WARMD_NODE_NAME")
    path = state_dir() / "node-id"
    try:
        kept = path.read_text().strip()
    except OSError:
        kept = ""
    if kept:
        return kept
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    seed = f"{machine or uuid.uuid4().hex}:{state_dir().resolve()}"
    name = f"{socket.gethostname()}-{hashlib.sha256(seed.encode()).hexdigest()[:8]}"
    tmp = path.with_name(f".node-id.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(name + "\n")
        os.link(tmp, path)  # atomic, and never replaces a name another process wrote first
    except FileExistsError:
        return path.read_text().strip() or name
    except OSError:  # a read-only state dir: the name still derives from the machine id
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return name


def embedded_maxmemory() -> str:
    """maxmemory of the embedded Redis (WARMD_EMBEDDED_MAXMEMORY, e.g. 4gb; 0 = no limit)."""
    return get("WARMD_EMBEDDED_MAXMEMORY")


def config_path() -> Path | None:
    """The daemon's warmd.yaml (WARMD_CONFIG); None: the embedded default config."""
    return get("WARMD_CONFIG")


def metrics_port() -> str | None:
    """WARMD_METRICS_PORT: port of each node agent's Prometheus endpoint (0: any free port)."""
    return get("WARMD_METRICS_PORT")


def compile_nice() -> int:
    """WARMD_COMPILE_NICE: nice increment of DeepGEMM's kernel-stage nvcc runs (0: none)."""
    return get("WARMD_COMPILE_NICE")


def library_packages() -> tuple[str, ...]:
    """WARMD_LIBRARY_PACKAGES: more packages that each register a JIT library."""
    return get("WARMD_LIBRARY_PACKAGES")


def triton_modules() -> tuple[str, ...]:
    """WARMD_TRITON_MODULES: where a trusted producer looks up captured Triton kernels."""
    return get("WARMD_TRITON_MODULES")


def deep_gemm_nvcc() -> str | None:
    """DG_JIT_NVCC_COMPILER: the nvcc DeepGEMM's JIT runs, when the operator chose one."""
    return get("DG_JIT_NVCC_COMPILER")


def vllm_flashinfer_autotune_dir() -> Path | None:
    """VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR when set (else vLLM's versioned default)."""
    return get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
