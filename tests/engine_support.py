"""What the engine tests share: the engines' own cache variables, and the excerpt of
SGLang 0.5.23's source that forces its cache directories (run as SGLang runs it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "tests" / "data" / "engine_src" / "sglang-0.5.23" / "cache_dirs_excerpt.txt"
CACHE_ENV = ("SGLANG_CACHE_DIR", "SGLANG_DG_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME",
             "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_AUTOTUNE_CACHE_DIR", "DG_JIT_CACHE_DIR",
             "VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
