#!/usr/bin/env bash
# Issue 10 validation on a lent H200: a plan made from a vLLM serve command with DP > 1 and
# expert parallel, `warmd warmup` of it, then an independent dense and grouped DeepGEMM sweep
# over the engine's whole M range (scripts/bench/deepgemm_sweep.py --engine-range) that must compile
# nothing new. Record the result in docs/benchmarks.md with this command.
#
# Through the device tool, kind nvidia-h200 (the plan is per rank: one GPU is enough),
# carrying the wheels in .whl/ (sgl-deep-gemm, apache-tvm-ffi, redis; see device_deepgemm.sh):
#     [WORKERS=4] bash scripts/bench/device_engine_launch.sh [MAX_NUM_BATCHED_TOKENS]
# MODEL defaults to the bundled Qwen3-30B-A3B-FP8 config (shapes only: no weights needed).
# Output: $OUT/device.log, $OUT/plan.json, $OUT/warmup.json, $OUT/sweep.json.
set -uo pipefail
OUT=${OUT:-/tmp/engine-launch-out}
TOKENS=${1:-2048}
MODEL=${MODEL:-warmd/examples/qwen3-30b-a3b-fp8}
mkdir -p "$OUT"
LOG="$OUT/device.log"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
pip_target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/engine-launch-dg-cache}
export WARMD_STATE_DIR=${WARMD_STATE_DIR:-/tmp/engine-launch-state}
rm -rf "$DG_JIT_CACHE_DIR" "$WARMD_STATE_DIR"
SERVE=(vllm serve "$MODEL" --tensor-parallel-size 2 --data-parallel-size 2
       --enable-expert-parallel --max-num-batched-tokens "$TOKENS" --trust-remote-code)
LIBS=(--with deep_gemm --without flashinfer --engine-version 0.11.0)
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/device.log"; }
nvidia-smi -L 2>&1 | tee "$OUT/device.log"
log "serve command: ${SERVE[*]}"
python3 -m warmd plan --json "${LIBS[@]}" -- "${SERVE[@]}" > "$OUT/plan.json" || exit 1
python3 - "$OUT/plan.json" <<'PY' | tee -a "$OUT/device.log"
import json, sys
plan = json.load(open(sys.argv[1]))
print("plan", plan["plan_key"], "model", plan["model"], "max_tokens", plan["max_tokens"],
      "moe_tokens", plan["moe_tokens"])
for note in plan["engine_notes"]:
    print("  engine:", note)
for t in plan["tasks"]:
    if t["library"] == "deep_gemm":
        print(f"  {t['kernel']} groups={t['num_groups']} N={t['n']} K={t['k']} "
              f"M {t['m'][0]}..{t['m'][-1]} ({len(t['m'])})")
PY
log "warmup"
python3 -m warmd warmup --json --no-shared --library deep_gemm --workers "${WORKERS:-4}" \
    "${LIBS[@]}" -- "${SERVE[@]}" \
    > "$OUT/warmup.json" 2>> "$OUT/device.log" || { log "warmup failed"; exit 1; }
log "independent sweep over the engine's whole M range"
python3 scripts/bench/deepgemm_sweep.py --json --engine-range "${LIBS[@]}" -- "${SERVE[@]}" \
    > "$OUT/sweep.json" 2>> "$OUT/device.log"
rc=$?
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('sweep calls', s['calls'], \
'new entries', len(s['new_entries']), 'failed', s['failed'], 'seconds', s['seconds'])" \
    "$OUT/sweep.json" | tee -a "$OUT/device.log"
log "sweep exit code $rc (0: nothing new compiled)"
exit $rc
