#!/usr/bin/env bash
# A refactor measured on the H200: the same DeepGEMM warmups (cold, from the store, from
# disk) on the tree before it and on this tree, in one run, for both DeepGEMM generations
# that load there (scripts/bench/bench_before_after.py; results in docs/benchmarks.md).
#
# Through the device tool, kind nvidia-h200, carrying .dv/ (as scripts/bench/device_verify.sh:
# .dv/whl/ the cp312 wheels, .dv/vdg.tar.xz vLLM 0.34.0's vllm/third_party/deep_gemm) and
# .carry-before/ (`git archive <commit> warmd | tar -x -C .carry-before`):
#     bash scripts/bench/device_before_after.sh
# GENERATIONS="vendored-2.8.1 sgl-0.1.4.post1" (the default) picks them; ENGINE_VERSION the
# engine release both trees plan for. Output: $OUT/<generation>/before_after.json and .log.
set -uo pipefail
OUT=${OUT:-/tmp/before-after-out}
DV=${DV:-.dv}
mkdir -p "$OUT"
LOG="$OUT/device.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
deepgemm_sites "$DV"/whl /tmp/site /tmp/dg014
V=/tmp/vllm034
vllm034_layout "$V" "$DV/vdg.tar.xz"
export VLLM_MOE_USE_DEEP_GEMM=1  # the MoE's grouped GEMMs through DeepGEMM, as before
device_banner
for generation in ${GENERATIONS:-vendored-2.8.1 sgl-0.1.4.post1}; do
    case $generation in
        vendored-2.8.1) path="/tmp/site:$V" ;;
        sgl-0.1.4.post1) path="/tmp/dg014:/tmp/site:$V" ;;
        *) echo "unknown generation $generation" >&2; exit 2 ;;
    esac
    mkdir -p "$OUT/$generation"
    PYTHONPATH="$path" python3 scripts/bench/bench_before_after.py \
        --tree "before=${BEFORE:-.carry-before}" --tree after=. --out "$OUT/$generation" \
        --rounds "${ROUNDS:-1}" --engine-version "${ENGINE_VERSION:-0.34.0}" 2>&1 \
        | sed "s/^/$generation /" | tee "$OUT/$generation/before_after.log" | tee -a "$LOG"
done
