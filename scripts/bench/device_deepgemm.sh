#!/usr/bin/env bash
# DeepGEMM warmup benchmark on one lent H200 (results: docs/benchmarks.md).
#
# Through the device tool, kind nvidia-h200, carrying the wheels in .whl/
# (sgl-deep-gemm 0.1.4.post1, apache-tvm-ffi 0.1.11, redis; see shared GPU notes):
#     bash scripts/bench/device_deepgemm.sh [--budget S] [--steps a,b] [--max-tokens N]
# Arguments go to scripts/bench/deepgemm_bench.py. Output: $OUT/device.log, $OUT/summary.json,
# $OUT/deepgemm-entries.tar.gz (small real cache entries for tests/data/deep_gemm).
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvidia-smi -L 2>&1 | tee "$OUT/device.log"
python3 scripts/bench/deepgemm_bench.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/device.log"
