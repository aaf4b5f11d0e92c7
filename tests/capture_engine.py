"""An engine's run-time compiles, for the capture tests: a Triton kernel (real sm_90
compile) and a FlashInfer module no plan names (gelu_tanh_and_mul, a real nvcc build), into
this process's TRITON_CACHE_DIR and FLASHINFER_WORKSPACE_BASE. Prints their seconds as JSON.

    python -m tests.capture_engine
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from warmd import settings


def build_flashinfer_module(act: str = "gelu_tanh") -> float:
    """Build <act>_and_mul for sm_90a the way a FlashInfer JIT call does (on a CPU machine
    with the same environment warmd's FlashInfer workers get)."""
    from warmd.libraries.flashinfer.executor import worker_env

    os.environ.update(worker_env("9.0a", settings.flashinfer_workspace_base()))
    from flashinfer.jit import gen_act_and_mul_module

    started = time.perf_counter()
    gen_act_and_mul_module(act).build()
    return time.perf_counter() - started


def main() -> None:
    from tests.triton_support import compile_add

    triton_s = compile_add(Path(settings.triton_cache_dir()))
    print(json.dumps({"triton_s": round(triton_s, 3),
                      "flashinfer_s": round(build_flashinfer_module(), 3)}))


if __name__ == "__main__":
    main()
