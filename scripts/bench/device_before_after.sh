#!/usr/bin/env bash
# The warm-path refactor measured on the H200: the same DeepGEMM warmups (cold, from the
# store, from disk) on the tree before it and on this tree, in one run
# (scripts/bench/bench_before_after.py; results in docs/benchmarks.md).
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (see
# scripts/bench/device_speed.sh) and .carry-before/ (`git archive <commit> warmd | tar -x -C .carry-before`):
#     bash scripts/bench/device_before_after.sh
# Output: $OUT/before_after.json, $OUT/before_after.log.
set -uo pipefail
OUT=${OUT:-/tmp/before-after-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${WHEELS:-.whl-speed}"/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export VLLM_MOE_USE_DEEP_GEMM=1  # the MoE's grouped GEMMs through DeepGEMM, as before
python3 scripts/bench/bench_before_after.py --tree "before=${BEFORE:-.carry-before}" \
    --tree after=. --out "$OUT" --rounds "${ROUNDS:-1}" 2>&1 | tee "$OUT/before_after.log"
