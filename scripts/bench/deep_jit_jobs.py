"""The compile jobs warmd emits for a deep_jit DeepGEMM (sgl-deep-gemm 0.2.x, DeepGEMM 2.8),
shown and built on a machine without a GPU (results: docs/benchmarks.md).

For each example kernel: the kernel.cu the package's extension generates (its template,
filled with the example's arguments: on a GPU DeepGEMM's heuristics choose them), DeepJIT's
key and entry name under this machine's nvcc, and the nvcc arguments (the job the kernel
stage's shim records and a builder builds). With --build ROOT each job is compiled with the
real nvcc into ROOT/cache/<entry>/ as a builder does (listed.build_entry), timed.

    pip download --no-deps sgl-deep-gemm==0.2.3.post2 -d /tmp/dg && unzip -q -d /tmp/dg/site \
        /tmp/dg/*.whl
    python scripts/bench/deep_jit_jobs.py --package /tmp/dg/site/deep_gemm --build /tmp/dg/root
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from warmd import settings
from warmd.libraries.deep_gemm import deep_jit
from warmd.libraries.deep_gemm.listed import ListedJob, build_entry, nvcc_version
from warmd.libraries.deep_gemm.nvcc_shim import job_key

# (tag, impl, template arguments): sm_90a examples, a dense GEMM as on an H200 (132 SMs).
EXAMPLES = (
    ("transpose_fp32", "transpose_fp32", [512, 64, 32, 32]),
    ("sm90_fp8_gemm_1d2d", "sm90_fp8_gemm_1d2d_impl",
     ["cute::UMMA::Major::K", 0, 2304, 4096, 1, 64, 16, 128, 128, 128, 32, 16, 128, 128, 1,
      "false", 132, "GemmType::Normal", "cutlass::bfloat16_t",
      "epilogue::transform::EpilogueIdentity", 128]),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, required=True,
                        help="an unpacked deep_gemm package (its include/ and _C*.so)")
    parser.add_argument("--capability", default="9.0", help="GPU capability (default 9.0)")
    parser.add_argument("--build", type=Path, help="compile each job into this cache root")
    args = parser.parse_args()
    try:
        major, minor = (int(x) for x in args.capability.split("."))
        config = deep_jit.config_of(args.package)
    except (ValueError, OSError) as exc:
        print(f"deep_jit_jobs: {exc}", file=sys.stderr)
        return 2
    nvcc = str(settings.cuda_home() / "bin" / "nvcc")
    version = nvcc_version(nvcc)
    flags = deep_jit.default_flags((major, minor))
    template = deep_jit.job_template(flags, config)
    jobs = []
    for tag, impl, values in EXAMPLES:
        source = deep_jit.template_source(args.package, impl, values)
        began = time.perf_counter()
        key = deep_jit.cache_key(config, version, flags, source)
        job = ListedJob(deep_jit.entry_name(tag, key), job_key(template, source.encode()),
                        tuple(template), source, None, version, str(config.include_dir))
        record = {"entry": job.entry, "key_seconds": round(time.perf_counter() - began, 3),
                  "args": list(job.args)}
        if args.build:
            with tempfile.TemporaryDirectory() as run:
                began = time.perf_counter()
                failure = build_entry(Path(run), job, nvcc, args.build, str(config.include_dir))
                record["nvcc_seconds"] = round(time.perf_counter() - began, 1)
            record["built"] = failure is None
            entry = args.build / "cache" / job.entry
            if failure is None:
                record["files"] = {p.name: p.stat().st_size for p in sorted(entry.iterdir())}
            else:
                record["error"] = failure[-500:]
        jobs.append(record)
    print(json.dumps({"package": str(args.package), "signature": config.extra_signature,
                      "nvcc": version.strip().splitlines()[-1] if version else None,
                      "jobs": jobs}, indent=1))
    return 0 if all(j.get("built", True) for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
