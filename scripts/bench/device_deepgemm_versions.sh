#!/usr/bin/env bash
# DeepGEMM 2.8.1 as vLLM 0.34.0 ships it, and sgl-deep-gemm 0.1.4.post1, on one lent H200
# (results: docs/benchmarks.md "DeepGEMM as the engine imports it").
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (warmd's dependencies,
# sgl-deep-gemm 0.1.4.post1, apache-tvm-ffi) and .vdg/vdg.tar.xz (vllm/third_party/deep_gemm
# from the vLLM 0.34.0 wheel, see ../shared/gpu-libraries.md):
#     bash scripts/bench/device_deepgemm_versions.sh
# WHEELS and VDG name them elsewhere. Two Python paths, never mixed: "vendored" is vLLM
# 0.34.0 as installed (its dist-info and vllm/third_party/deep_gemm, no separate DeepGEMM),
# "external" adds sgl-deep-gemm 0.1.4.post1 as deep_gemm (which vLLM then imports first).
# Steps and checks: scripts/bench/deepgemm_versions_bench.py. Output: $OUT/versions.json,
# $OUT/device.log. Stays under 9 minutes (BUDGET seconds for the steps, default 480).
# PATTERN=only runs just the plan, the cold 2.8.1 warmup and the engine-pattern step (vLLM
# 0.34.0's own DeepGEMM calls on warmd's cache, scripts/bench/deepgemm_engine_pattern.py: no new
# entry may appear); PATTERN=also adds that step to the whole run.
set -uo pipefail
OUT=${OUT:-/tmp/dgv-out}
WHEELS=${WHEELS:-.whl-speed}
VDG=${VDG:-.vdg/vdg.tar.xz}
mkdir -p "$OUT"
LOG="$OUT/device.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
deepgemm_sites "$WHEELS" /tmp/site /tmp/dg014
V=/tmp/vllm034
vllm034_layout "$V" "$VDG"
device_banner
python3 scripts/bench/deepgemm_versions_bench.py --out "$OUT" --budget "${BUDGET:-480}" \
    --pattern "${PATTERN:-no}" \
    --vendored "/tmp/site:$V:$PWD" --external "/tmp/dg014:/tmp/site:$V:$PWD" 2>&1 \
    | tee -a "$LOG"
