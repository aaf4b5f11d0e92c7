"""The named accessors of warmd.knobs' table: one function per variable code names.

One way to read a knob: code that names a variable calls its accessor here
(``settings.state_dir()``), which is ``get(ENV)`` and nothing more, or a value derived from
several knobs (``cuda_home()``). A test holds warmd to that. The accessors a node's work
reads take the variables to read (``environ``; default: this process's environment):
warmd.context.NodeContext reads a node's own through them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from warmd.knobs import DEEP_GEMM_KEY_ENV, ENGINE_KERNEL_ENV, get, is_set, present

Environ = Mapping[str, str] | None  # the variables read; None: this process's environment


def xdg_cache_home() -> Path:
    return get("XDG_CACHE_HOME")


def state_dir(environ: Environ = None) -> Path:
    """warmd's own state: embedded Redis data, logs, local task records."""
    return get("WARMD_STATE_DIR", environ)


def vllm_cache_root() -> Path:
    return get("VLLM_CACHE_ROOT")


def deep_gemm_cache_dir() -> Path:
    """Where DeepGEMM reads and writes kernels: DG_JIT_CACHE_DIR as the engine sets it
    (vLLM: $VLLM_CACHE_ROOT/deep_gemm), taken as one path. sgl-deep-gemm 0.1.4.post1 has no
    lookup list: with DG_JIT_CACHE_DIR=A:B it compiles into a directory literally named
    'A:B' and reads nothing from B (measured on an H200, docs/benchmarks.md)."""
    return get("DG_JIT_CACHE_DIR")


def engine_kernel_env(environ: Environ = None) -> dict[str, str]:
    """The engines' own kernel-changing variables that are set, with their text."""
    return present(ENGINE_KERNEL_ENV, environ)


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


def visible_devices(environ: Environ = None) -> str | None:
    """CUDA_VISIBLE_DEVICES as set (None: every GPU is visible; empty: none is)."""
    return get("CUDA_VISIBLE_DEVICES", environ)


def visible_gpu_ids(environ: Environ = None) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES parsed (the one place that does): its ids (indices or UUIDs)
    in order; None when unset (every GPU is visible), () when set and empty (none is)."""
    visible = visible_devices(environ)
    if visible is None:
        return None
    return tuple(part.strip() for part in visible.split(",") if part.strip())


def disabled_kernels(environ: Environ = None) -> frozenset[str]:
    """WARMD_DISABLED_KERNELS (the engine's own VLLM_DISABLED_KERNELS is an engine variable:
    warmd.engines.environment)."""
    return frozenset(get("WARMD_DISABLED_KERNELS", environ))


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


def namespace(environ: Environ = None) -> str:
    """Salt of every shared-cache fingerprint: change it to disown a whole set of entries."""
    return get("WARMD_NAMESPACE", environ)


def namespace_override() -> str | None:
    """WARMD_NAMESPACE when set (the daemon's config file is overridden only then)."""
    return namespace() if is_set("WARMD_NAMESPACE") else None


# WARMD_SIGNING_KEY=<this><path>: the key was moved into that 0600 file (warmd.store.credentials)
SECRET_FILE_PREFIX = "warmd-secret-file:"


def signing_key_file(environ: Environ = None) -> str | None:
    path = get("WARMD_SIGNING_KEY_FILE", environ)
    return str(path) if path else None


def signing_key_text(environ: Environ = None) -> str | None:
    """WARMD_SIGNING_KEY as set: the key, or where it was moved (SECRET_FILE_PREFIX)."""
    return get("WARMD_SIGNING_KEY", environ)


def signing_key(environ: Environ = None) -> bytes | None:
    """HMAC key for manifests, from WARMD_SIGNING_KEY_FILE or WARMD_SIGNING_KEY."""
    path = signing_key_file(environ)
    if path:
        return Path(path).read_bytes().strip()
    value = signing_key_text(environ)
    if value and value.startswith(SECRET_FILE_PREFIX):  # moved out of the environment
        return Path(value[len(SECRET_FILE_PREFIX):]).read_bytes().strip()
    return value.encode() if value else None


def max_artifact_bytes(environ: Environ = None) -> int:
    return int(get("WARMD_MAX_ARTIFACT_BYTES", environ))


def cache_ttl_seconds(environ: Environ = None) -> int:
    """Shared-cache entries expire this long after their last use (WARMD_CACHE_TTL_DAYS)."""
    return int(get("WARMD_CACHE_TTL_DAYS", environ) * 86400)


def redis_timeout(environ: Environ = None) -> float:
    """Bound on one shared-cache operation, in seconds (WARMD_REDIS_TIMEOUT)."""
    return get("WARMD_REDIS_TIMEOUT", environ)


def redis_join_budget(environ: Environ = None) -> float:
    """How long in all a warmup retries a slow shared cache (WARMD_REDIS_JOIN_BUDGET)."""
    return get("WARMD_REDIS_JOIN_BUDGET", environ)


def single_flight_timeout(environ: Environ = None) -> float:
    """The longest a warmup waits on another node's claim (WARMD_SINGLE_FLIGHT_TIMEOUT)."""
    return get("WARMD_SINGLE_FLIGHT_TIMEOUT", environ)


def task_timeout(environ: Environ = None) -> float:
    """The longest one piece of compile work runs before it is killed (WARMD_TASK_TIMEOUT)."""
    return get("WARMD_TASK_TIMEOUT", environ)


def node_name(environ: Environ = None) -> str:
    """This machine's stable name in node records, `warmd status` and shared-cache stats:
    WARMD_NODE_NAME, else <state dir>/node-id, written once as <host>-<8 hex> from the machine
    id and the state dir (so restarts keep it, and two state dirs on one host differ)."""
    import hashlib
    import socket
    import uuid

    if get("WARMD_NODE_NAME", environ):  # an accessor's own variable (node_name is its accessor)
        return get("WARMD_NODE_NAME", environ)
    path = state_dir(environ) / "node-id"
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
    seed = f"{machine or uuid.uuid4().hex}:{state_dir(environ).resolve()}"
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


def discovery_processes(environ: Environ = None) -> int:
    """WARMD_DISCOVERY_PROCESSES: a kernel stage's discovery processes while it records."""
    return max(1, get("WARMD_DISCOVERY_PROCESSES", environ))


def library_packages() -> tuple[str, ...]:
    """WARMD_LIBRARY_PACKAGES: more packages that each register a JIT library."""
    return get("WARMD_LIBRARY_PACKAGES")


def triton_modules(environ: Environ = None) -> tuple[str, ...]:
    """WARMD_TRITON_MODULES: where a trusted producer looks up captured Triton kernels."""
    return get("WARMD_TRITON_MODULES", environ)


def deep_gemm_nvcc() -> str | None:
    """DG_JIT_NVCC_COMPILER: the nvcc DeepGEMM's JIT runs, when the operator chose one."""
    return get("DG_JIT_NVCC_COMPILER")


def vllm_flashinfer_autotune_dir() -> Path | None:
    """VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR when set (else vLLM's versioned default)."""
    return get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
