"""Where a cold DeepGEMM warmup's first seconds go on a GPU node (issue 12): the process
costs a discovery pays before and per kernel, each measured in fresh processes.

    python3 scripts/bench/discovery_profile.py --out DIR

Writes DIR/profile.json: median seconds of `sh -c true`, `python3 -I -c pass`, the record
shim answering one DeepGEMM-style compile, `cuobjdump -symbols` on a cubin (DeepGEMM runs it
on every kernel it loads), and fresh processes importing torch, initialising CUDA and
importing deep_gemm (three each, in that order, so the first shows a cold page cache)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from warmd import settings
from warmd.libraries.deep_gemm.nvcc_shim import RECORD, build_placeholder, write_shim

IMPORTS = {
    "import_torch": "import torch",
    "torch_cuda": "import torch; torch.empty(1, device='cuda'); torch.cuda.synchronize()",
    "torch_cuda_deep_gemm": "import torch; torch.empty(1, device='cuda'); import deep_gemm",
}


def timed(command: list[str] | str, times: int, **kwargs) -> list[float]:
    seconds = []
    for _ in range(times):
        began = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, **kwargs)
        seconds.append(round(time.perf_counter() - began, 4))
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    nvcc = str(settings.cuda_home() / "bin" / "nvcc")
    cuobjdump = str(settings.cuda_home() / "bin" / "cuobjdump")
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "jobs").mkdir()
        began = time.perf_counter()
        cubin = build_placeholder(run, nvcc, "--gpu-architecture=sm_90a")
        result["placeholder_build_s"] = round(time.perf_counter() - began, 3)
        shim = write_shim(run, RECORD, nvcc)
        source = run / "kernel.cu"
        calls = []
        for index in range(10):
            source.write_text(f"// kernel {index}\n")
            calls.append(f"cd {run} && {shim} {source} -cubin -o {run / 'out.cubin'} "
                         "-O3 --gpu-architecture=sm_90a")
        shim_s = []
        for command in calls:
            shim_s += timed(command, 1, shell=True)
        result["shim_record_s"] = shim_s
        result["sh_true_s"] = timed(["sh", "-c", "true"], 10)
        result["python_I_pass_s"] = timed([sys.executable, "-I", "-c", "pass"], 10)
        if Path(cuobjdump).is_file():
            result["cuobjdump_symbols_s"] = timed([cuobjdump, "-symbols", str(cubin)], 10)
    for name, code in IMPORTS.items():
        try:
            result[f"{name}_s"] = timed([sys.executable, "-c", code], 3)
        except subprocess.CalledProcessError as exc:  # no GPU or no deep_gemm here
            result[f"{name}_error"] = exc.stderr.decode(errors="replace").strip()[-200:]
    result["medians"] = {k: statistics.median(v) for k, v in result.items()
                         if isinstance(v, list)}
    (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["medians"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
