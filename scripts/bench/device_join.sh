#!/usr/bin/env bash
# A node joining a warm cluster, and `warmd start` on a warm store, on one lent H200 (issue 12;
# results: docs/benchmarks.md "Warmup speed"). The image has no Ray: it travels trimmed.
#
# Through the device tool, kind nvidia-h200, carrying .whl-speed/ (warmd's dependencies and
# sgl-deep-gemm, as for scripts/bench/device_speed.sh) and .ray-carry/ (Ray 2.60.0 cp312 trimmed by
# scripts/bench/ray_carry.py to ray-2.60.0-cp312.tar.xz, plus the wheels of Ray's dependencies the
# image lacks: jsonschema, jsonschema-specifications, referencing, rpds-py):
#     bash scripts/bench/device_join.sh
# What runs: scripts/bench/bench_join.py --library deep_gemm (one DeepGEMM task of
# Qwen3-30B-A3B-FP8 compiled on node a's real GPU at the cold `warmd start`, then `warmd stop`
# + `warmd start` on warm caches, then JOINS nodes with empty caches joining).
# Output: $OUT/join.json (the bench's result), $OUT/join.log (its stderr and the setup).
# Stays under 5 minutes (the bench is cut at BUDGET seconds, default 240).
set -uo pipefail
OUT=${OUT:-/tmp/join-out}
mkdir -p "$OUT"
LOG="$OUT/join.log"
WHEELS=${WHEELS:-.whl-speed}
RAY_CARRY=${RAY_CARRY:-.ray-carry}
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
began=$EPOCHREALTIME
: >"$LOG"
pip_target /tmp/site "$WHEELS"/*.whl "$RAY_CARRY"/*.whl
tar -xJf "$RAY_CARRY"/ray-*.tar.xz -C /tmp/site >>"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
echo "setup (wheels, Ray unpacked): $(awk "BEGIN {print $EPOCHREALTIME - $began}") s" | tee -a "$LOG"
export PYTHONPATH=/tmp/site:$PWD
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
# tests/ is imported as a namespace package: a regular `tests` package in the image would
# shadow it, so say so plainly instead of failing inside the bench.
python3 -c 'import ray, tests.cluster_support, deep_gemm; print("ray", ray.__version__,
ray.__file__)' 2>&1 | tee -a "$LOG" || exit 1
nvidia-smi -L 2>&1 | tee -a "$LOG"
timeout "${BUDGET:-240}" python3 scripts/bench/bench_join.py --library deep_gemm \
    --joins "${JOINS:-3}" --json >"$OUT/join.json" 2>>"$LOG"
rc=$?
echo "bench_join rc=$rc" | tee -a "$LOG"
cat "$OUT/join.json"
tail -20 "$LOG"
exit $rc
