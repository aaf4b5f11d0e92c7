"""Every knob warmd reads from the environment, in one place, with the engines' own names."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache")


def state_dir() -> Path:
    """warmd's own state: embedded Redis data, logs, local task records."""
    return Path(os.environ.get("WARMD_STATE_DIR") or xdg_cache_home() / "warmd")


def vllm_cache_root() -> Path:
    return Path(os.environ.get("VLLM_CACHE_ROOT") or xdg_cache_home() / "vllm")


def deep_gemm_cache_dir() -> Path:
    """Where DeepGEMM reads and writes kernels: DG_JIT_CACHE_DIR as the engine sets it
    (vLLM: $VLLM_CACHE_ROOT/deep_gemm), taken as one path. sgl-deep-gemm 0.1.4.post1 has no
    lookup list: with DG_JIT_CACHE_DIR=A:B it compiles into a directory literally named
    'A:B' and reads nothing from B (measured on an H200, docs/benchmarks.md)."""
    explicit = os.environ.get("DG_JIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return vllm_cache_root() / "deep_gemm"


# DeepGEMM knobs that change its compiler signature or flags, hence every kernel's cache key.
DEEP_GEMM_KEY_ENV = ("DG_JIT_USE_NVRTC", "DG_JIT_NVCC_COMPILER", "DG_JIT_CPP_STANDARD",
                     "DG_JIT_WITH_LINEINFO", "DG_JIT_DEBUG", "DG_JIT_PTXAS_VERBOSE",
                     "DG_JIT_PTXAS_CHECK")


def deep_gemm_key_env() -> dict[str, str]:
    return {name: os.environ[name] for name in DEEP_GEMM_KEY_ENV if os.environ.get(name)}


def flashinfer_workspace_base() -> Path:
    """FlashInfer caches under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default: ~)."""
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or _home())


def redis_url() -> str | None:
    return os.environ.get("WARMD_REDIS_URL") or None


def namespace() -> str:
    """Salt of every shared-cache fingerprint: change it to disown a whole set of entries."""
    return namespace_override() or "default"


def namespace_override() -> str | None:
    """WARMD_NAMESPACE when set (the daemon's config file is overridden only then)."""
    return os.environ.get("WARMD_NAMESPACE") or None


def signing_key_file() -> str | None:
    return os.environ.get("WARMD_SIGNING_KEY_FILE") or None


def signing_key() -> bytes | None:
    """HMAC key for manifests, from WARMD_SIGNING_KEY_FILE or WARMD_SIGNING_KEY."""
    path = signing_key_file()
    if path:
        return Path(path).read_bytes().strip()
    value = os.environ.get("WARMD_SIGNING_KEY")
    return value.encode() if value else None


def max_artifact_bytes() -> int:
    return int(_positive_float("WARMD_MAX_ARTIFACT_BYTES", 256 * 1024 * 1024))


def _positive_float(var: str, default: float) -> float:
    from warmd.errors import WarmdInputError

    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise WarmdInputError(f"{var} must be a positive number, got {raw!r}")
    return value


def cache_ttl_seconds() -> int:
    """Shared-cache entries expire this long after their last use (WARMD_CACHE_TTL_DAYS)."""
    return int(_positive_float("WARMD_CACHE_TTL_DAYS", 30.0) * 86400)


def redis_timeout() -> float:
    """Bound on one shared-cache operation, in seconds (WARMD_REDIS_TIMEOUT)."""
    return _positive_float("WARMD_REDIS_TIMEOUT", 2.0)


def node_name() -> str:
    """This machine's stable name in node records, `warmd status` and shared-cache stats:
    WARMD_NODE_NAME, else <state dir>/node-id, written once as <host>-<8 hex> from the machine
    id and the state dir (so restarts keep it, and two state dirs on one host differ)."""
    import hashlib
    import socket
    import uuid

    if os.environ.get("WARMD_NODE_NAME"):
        return os.environ["WARMD_NODE_NAME"]
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
    return os.environ.get("WARMD_EMBEDDED_MAXMEMORY") or "4gb"


def config_path() -> Path | None:
    """The daemon's warmd.yaml (WARMD_CONFIG); None: the embedded default config."""
    value = os.environ.get("WARMD_CONFIG")
    return Path(value) if value else None


def metrics_port() -> str | None:
    """WARMD_METRICS_PORT: port of each node agent's Prometheus endpoint (0: any free port)."""
    return os.environ.get("WARMD_METRICS_PORT") or None
