#!/usr/bin/env bash
# `warmd verify` against the engine's own DeepGEMM calls, on one lent H200, for both DeepGEMM
# generations that load there: vLLM 0.34.0's vendored 2.8.1 (vLLM as `pip install` leaves
# it) and sgl-deep-gemm 0.1.4.post1 (which vLLM then imports first). Results:
# docs/benchmarks.md "warmd verify on the H200".
#
# Through the device tool, kind nvidia-h200, carrying .dv/ (git-ignored): .dv/whl/ holds the
# cp312 wheels of sgl-deep-gemm 0.1.4.post1, apache-tvm-ffi 0.1.11, click, pyyaml, redis,
# rich (and theirs), nvidia-ml-py; .dv/vdg.tar.xz is vllm/third_party/deep_gemm of the vLLM
# 0.34.0 wheel (see ../shared/gpu-libraries.md):
#     bash scripts/bench/device_verify.sh
# Per generation, in one environment for warmd and the engine (VLLM_CACHE_ROOT only: the
# DeepGEMM directory is what vLLM's rule makes of it, $VLLM_CACHE_ROOT/deep_gemm):
#   1. warmd warmup of the serve line (cold);
#   2. warmd verify: must say yes (exit 0);
#   3. scripts/bench/deepgemm_engine_pattern.py, vLLM 0.34.0's own DeepGEMM calls in a fresh
#      process: must compile nothing (exit 0);
#   4. one entry removed; warmd verify: must say no (exit 1) and name it;
#   5. the engine-pattern client again: must compile exactly what verify named.
# Output: $OUT/device.log, $OUT/<generation>-<step>.json.
set -uo pipefail
OUT=${OUT:-/tmp/device-verify-out}
DV=${DV:-.dv}
mkdir -p "$OUT"
LOG="$OUT/device.log"
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
deepgemm_sites "$DV"/whl /tmp/site /tmp/dg014
V=/tmp/vllm034
vllm034_layout "$V" "$DV/vdg.tar.xz"
export VLLM_MOE_USE_DEEP_GEMM=1
unset DG_JIT_CACHE_DIR
SERVE=(vllm serve tests/data/models/qwen3-235b-a22b-fp8 --tensor-parallel-size 4)
PLAN=(--target h200)
device_banner
failures=0
check() {  # check NAME CONDITION-TEXT RESULT
    if [ "$3" = yes ]; then log "CHECK ok: $1 ($2)"; else log "CHECK FAILED: $1 ($2)"; failures=$((failures + 1)); fi
}

generation() {  # generation NAME PYTHONPATH
    local name=$1 rc removed
    export PYTHONPATH="$2:$PWD" VLLM_CACHE_ROOT=/tmp/verify-$name/vllm
    export WARMD_STATE_DIR=/tmp/verify-$name/state
    rm -rf "/tmp/verify-$name"
    log "== $name: $(python3 -m warmd plan --json "${PLAN[@]}" -- "${SERVE[@]}" | python3 -c \
'import json,sys; p=json.load(sys.stdin); d=p["libraries"]["deep_gemm"]; print(d.get("module"), d.get("version"), "tasks", len(p["tasks"]), "cache_dirs", p["cache_dirs"]["deep_gemm"])')"
    SECONDS=0
    timeout 240 python3 -m warmd warmup --json --no-shared --library deep_gemm "${PLAN[@]}" \
        -- "${SERVE[@]}" >"$OUT/$name-warmup.json" 2>>"$LOG"
    log "$name warmup exit $? in ${SECONDS}s: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["kernels"])' "$OUT/$name-warmup.json")"
    SECONDS=0
    python3 -m warmd verify --json "${PLAN[@]}" -- "${SERVE[@]}" >"$OUT/$name-verify.json" 2>>"$LOG"
    rc=$?
    log "$name verify exit $rc in ${SECONDS}s"
    check "$name verify says yes after the warmup" "exit 0" "$([ $rc = 0 ] && echo yes)"
    SECONDS=0
    timeout 120 python3 scripts/bench/deepgemm_engine_pattern.py --json "${PLAN[@]}" \
        -- "${SERVE[@]}" >"$OUT/$name-pattern.json" 2>>"$LOG"
    rc=$?
    log "$name engine pattern exit $rc in ${SECONDS}s: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["calls"], "calls,", len(r["new_entries"]), "new entries,", r["failed_count"], "failed")' "$OUT/$name-pattern.json")"
    check "$name engine compiles nothing when verify says yes" "exit 0" "$([ $rc = 0 ] && echo yes)"
    removed=$(ls "$VLLM_CACHE_ROOT/deep_gemm/cache" | grep -i gemm | sort | head -1)
    rm -rf "$VLLM_CACHE_ROOT/deep_gemm/cache/$removed"
    log "$name removed $removed"
    python3 -m warmd verify --json "${PLAN[@]}" -- "${SERVE[@]}" >"$OUT/$name-verify-removed.json" 2>>"$LOG"
    rc=$?
    named=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join(sorted({n for v in r["verdicts"] for n in v["missing"]})))' "$OUT/$name-verify-removed.json")
    log "$name verify after removal exit $rc, missing: $named"
    check "$name verify says no and names the removed entry" "exit 1, names it" \
        "$([ $rc = 1 ] && [ "$named" = "$removed" ] && echo yes)"
    timeout 120 python3 scripts/bench/deepgemm_engine_pattern.py --json "${PLAN[@]}" \
        -- "${SERVE[@]}" >"$OUT/$name-pattern-removed.json" 2>>"$LOG"
    rc=$?
    compiled=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join(sorted(r["new_entries"])))' "$OUT/$name-pattern-removed.json")
    log "$name engine pattern after removal exit $rc, compiled: $compiled"
    check "$name engine compiles what verify named" "exit 1, the same entry" \
        "$([ $rc = 1 ] && [ "$compiled" = "$removed" ] && echo yes)"
}

generation vendored-2.8.1 "/tmp/site:$V"
generation sgl-0.1.4.post1 "/tmp/dg014:/tmp/site:$V"
log "$failures check(s) failed"
exit $((failures > 0))
