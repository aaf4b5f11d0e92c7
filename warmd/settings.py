"""Every knob warmd reads from the environment, in one place, with the engines' own names."""

from __future__ import annotations

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
    (vLLM: $VLLM_CACHE_ROOT/deep_gemm). Only the first root of an A:B list is writable."""
    explicit = os.environ.get("DG_JIT_CACHE_DIR")
    if explicit:
        return Path(explicit.split(":")[0])
    return vllm_cache_root() / "deep_gemm"


def flashinfer_workspace_base() -> Path:
    """FlashInfer caches under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default: ~)."""
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or _home())


def redis_url() -> str | None:
    return os.environ.get("WARMD_REDIS_URL") or None


def namespace() -> str:
    """Salt of every shared-cache fingerprint: change it to disown a whole set of entries."""
    return os.environ.get("WARMD_NAMESPACE") or "default"


def signing_key() -> bytes | None:
    """HMAC key for manifests, from WARMD_SIGNING_KEY_FILE or WARMD_SIGNING_KEY."""
    path = os.environ.get("WARMD_SIGNING_KEY_FILE")
    if path:
        return Path(path).read_bytes().strip()
    value = os.environ.get("WARMD_SIGNING_KEY")
    return value.encode() if value else None


def max_artifact_bytes() -> int:
    return int(os.environ.get("WARMD_MAX_ARTIFACT_BYTES") or 256 * 1024 * 1024)
