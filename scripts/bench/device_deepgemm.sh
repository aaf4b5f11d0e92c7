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
LOG="$OUT/device.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
pip_target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L 2>&1 | tee "$LOG"
python3 scripts/bench/deepgemm_bench.py --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
