#!/usr/bin/env python3
"""What re-deriving one Triton claim from the library's kernel function costs (issue 29).

    PYTHONPATH=$PWD python scripts/bench/bench_triton_rederive.py [--runs 3] [--json]

rederive   tests/triton_kernels.py's add_kernel compiled for sm_90 by an engine stand-in
           (a process of its own) into a scratch cache, then re-derived from its packed
           entry: the rebuild process finds the function, searches the specialisation
           whose key is the claim's and compiles it (seconds, and whether every file is
           byte for byte the engine's)
flashinfer FlashInfer's own rms_norm_kernel (ten constexprs), compiled as Triton's launcher
           specialises it, re-derived with the default allow-list (vllm, sglang,
           flashinfer: the function found by scanning the installed packages)
search     the worst case a claim can cost: a kernel with four constexprs (written to a
           scratch module) and a key no specialisation has, searched until
           MAX_SPECIALIZATIONS keys were hashed (seconds, keys per second)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDE = '''import triton
import triton.language as tl


@triton.jit
def wide_kernel(x, n, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    offsets = tl.program_id(0) * A + tl.arange(0, B)
    tl.store(x + offsets, tl.load(x + offsets) * C + D, mask=offsets < n)
'''


def rederive_once(base: Path, engine: str = "compile_add") -> dict:
    from warmd.cache.rederived import private_dir
    from warmd.libraries.triton.cache import TritonCacheAdapter
    from warmd.libraries.triton.rederive import rederive

    cache = base / "engine"
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    f"from tests.triton_support import {engine}; {engine}(Path(sys.argv[1]))",
                    str(cache)], cwd=ROOT, check=True, capture_output=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    adapter = TritonCacheAdapter(cache, "9.0a")
    (entry,) = adapter.list_entries()
    started = time.perf_counter()
    got = rederive(adapter, entry.name, adapter.pack(entry), private_dir("bench-", base))
    return {"seconds": round(time.perf_counter() - started, 2), "identical": got.identical}


def search_worst(base: Path) -> dict:
    import importlib

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from warmd.libraries.triton import rebuild
    from warmd.libraries.triton import rederive as tr

    (base / "bench_wide_kernels.py").write_text(WIDE)
    sys.path.insert(0, str(base))
    fn = importlib.import_module("bench_wide_kernels").wide_kernel
    job = {"hash": "0" * 64, "ints": list(range(100, 100 + tr.MAX_INTS)),
           "args": [{"name": "x", "types": ["*fp32"], "div": True},
                    {"name": "n", "types": ["i32"], "div": False}]}
    backend = make_backend(GPUTarget("cuda", 90, 32))
    options = backend.parse_options({})
    started = time.perf_counter()
    found, why = rebuild.find_specialisation([fn], job, backend, options,
                                             get_cache_invalidating_env_vars())
    seconds = time.perf_counter() - started
    assert found is None
    return {"seconds": round(seconds, 2), "keys": rebuild.MAX_SPECIALIZATIONS,
            "keys_per_s": round(rebuild.MAX_SPECIALIZATIONS / seconds), "why": why}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ["WARMD_TRITON_MODULES"] = "tests.triton_kernels"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory(prefix="bench-triton-rederive-") as tmp:
        runs = [rederive_once(Path(tmp) / f"r{i}") for i in range(args.runs)]
        os.environ.pop("WARMD_TRITON_MODULES")  # the default allow-list
        library = rederive_once(Path(tmp) / "fi", "compile_flashinfer_rms_norm")
        worst = search_worst(Path(tmp))
    result = {"rederive": runs, "flashinfer": library, "search_worst": worst}
    if args.json:
        print(json.dumps(result))
        return
    for i, run in enumerate(runs):
        print(f"rederive run {i}: {run['seconds']:.2f}s, identical={run['identical']}")
    print(f"FlashInfer rms_norm_kernel, default allow-list: {library['seconds']:.2f}s, "
          f"identical={library['identical']}")
    print(f"worst-case search: {worst['keys']} keys hashed in {worst['seconds']:.2f}s "
          f"({worst['keys_per_s']}/s): {worst['why']}")


if __name__ == "__main__":
    main()
