"""Real Triton compiles for the tests (sm_90 cubins, no GPU needed): the engine stand-in
that fills TRITON_CACHE_DIR exactly as a serving process would."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: engine stand-in processes import this module
    from warmd.capture.watch import Capture, RuntimeJit


@contextlib.contextmanager
def _triton_env(cache_dir: Path) -> Iterator[None]:
    """TRITON_CACHE_DIR (and the fp-fusion default 3.9 warns without) for one compile, then
    as they were: a compile in the test process leaves nothing to later tests."""
    saved = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION")}
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compile_add(cache_dir: Path, block: int = 128, module: str = "tests.triton_kernels",
                kernel: str = "add_kernel") -> float:
    """Compile the add kernel (a module-level function of the library stand-in,
    tests/triton_kernels.py, unless module and kernel name another) for sm_90 into
    cache_dir; returns the seconds it took."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), kernel)
    source = ASTSource(fn=fn, signature={"x": "*fp32", "y": "*fp32", "out": "*fp32",
                                         "n": "i32", "BLOCK": "constexpr"},
                       constexprs={"BLOCK": block})
    with _triton_env(cache_dir):
        started = time.perf_counter()
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
        return time.perf_counter() - started


def capture_compile_add(capture: Capture, cache_dir: Path) -> RuntimeJit:
    """Start `capture`, compile the add kernel into cache_dir and return the one event the
    capture's scan then reports; the capture is stopped again either way."""
    capture.start()
    assert capture.wait_started(60)
    try:
        compile_add(cache_dir)
        (event,) = capture.scan()
    finally:
        capture.stop()
    return event


def compile_flashinfer_rms_norm(cache_dir: Path) -> None:
    """FlashInfer's own Triton rms_norm_kernel (flashinfer/triton/kernels/norm.py) for sm_90,
    specialised as Triton's launcher does for a bf16 RMSNorm of 1024-wide rows (every
    parameter in the attributes, 16-divisible pointers and strides; None and 1 arguments as
    constexprs)."""
    import triton
    from flashinfer.triton.kernels.norm import rms_norm_kernel as fn
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = {"x_scale_ptr": None, "r_ptr": None, "r_stride": 1, "o_scale_ptr": None,
                  "EPS": 1e-6, "BLOCK_SIZE": 1024, "HAS_IN_SCALE": False,
                  "HAS_OUT_SCALE": False, "HAS_OUTPUT": True, "HAS_RESIDUAL": False}
    types = {"n": "i32", "b": "i32", "x_ptr": "*bf16", "x_stride": "i32", "w_ptr": "*bf16",
             "o_ptr": "*bf16", "o_stride": "i32"}
    signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
    aligned = {"x_ptr", "w_ptr", "o_ptr", "x_stride", "o_stride"}
    attrs = {(i,): [["tt.divisibility", 16]] if name in aligned else []
             for i, name in enumerate(fn.arg_names)}
    with _triton_env(cache_dir):
        triton.compile(ASTSource(fn, signature, constexprs, attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})


def snapshot(root: Path) -> dict[str, int]:
    """path -> mtime_ns of every file under root: what a compile wrote shows as a change."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file()}


if __name__ == "__main__":  # a separate engine process: python -m tests.triton_support DIR
    import sys

    print(compile_add(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 128))
