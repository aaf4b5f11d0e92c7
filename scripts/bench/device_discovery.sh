#!/usr/bin/env bash
# Profile of DeepGEMM's kernel stage on one lent H200 (issue 12): process costs
# (scripts/bench/discovery_profile.py), then Qwen3-30B-A3B-FP8 relax 8192 cold with the default
# compile niceness and with none (WARMD_COMPILE_NICE=0), each report's kernel_stages
# timeline kept. Device tool, kind nvidia-h200, carry .whl-speed:
#     bash scripts/bench/device_discovery.sh
set -uo pipefail
OUT=${OUT:-/tmp/discovery-out}
mkdir -p "$OUT"
LOG="$OUT/discovery.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
: >"$LOG"
pip_target /tmp/site "${WHEELS:-.whl-speed}"/*.whl
export PYTHONPATH=/tmp/site:$PWD
export VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM:-1} WARMD_REDIS_URL=off
python3 scripts/bench/discovery_profile.py --out "$OUT" 2>&1 | tee -a "$LOG"
for nice in ${NICES:-10 0}; do
  export DG_JIT_CACHE_DIR=/tmp/dg-nice-$nice WARMD_STATE_DIR=/tmp/state-nice-$nice
  rm -rf "$DG_JIT_CACHE_DIR"
  t0=$(date +%s.%N)
  WARMD_COMPILE_NICE=$nice python3 -m warmd warmup --model qwen3-30b-a3b-fp8 --max-tokens 8192 \
      --mode relax --library deep_gemm --json >"$OUT/qwen-nice-$nice.json" 2>>"$LOG"
  t1=$(date +%s.%N)
  python3 - "$nice" "$t0" "$t1" "$OUT/qwen-nice-$nice.json" <<'PY' | tee -a "$LOG"
import json, sys
nice, t0, t1, path = sys.argv[1:]
d = json.load(open(path))
stage = (d.get("kernel_stages") or [{}])[0]
print(json.dumps({"nice": int(nice), "wall_s": round(float(t1) - float(t0), 2),
                  "kernels": d.get("kernels"), "nvcc_runs": stage.get("nvcc_runs"),
                  "discovery_s": stage.get("discovery_seconds"),
                  "timeline": stage.get("timeline")}))
PY
done
