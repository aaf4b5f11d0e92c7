# The device scripts' shared setup, sourced (never run) by scripts/bench/device_*.sh:
#     source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
# Sourcing it exports what every GPU run wants (unbuffered Python, CUDA_HOME) and defines:
#   pip_target DIR WHEEL...         the carried wheels into DIR, offline, no dependencies
#   pip_target_except DIR WHEELS NAME...  every wheel in folder WHEELS but the NAMEd projects'
#   deepgemm_sites WHEELS SITE DG014  warmd's dependencies (no DeepGEMM) into SITE, and
#                                   sgl-deep-gemm 0.1.4.post1 with apache-tvm-ffi into DG014
#   vllm034_layout DIR TARBALL      vLLM 0.34.0 as installed, under DIR: its dist-info and
#                                   vllm/third_party/deep_gemm from TARBALL (what warmd's probe
#                                   and `import vllm.third_party.deep_gemm` see)
#   device_banner                   the GPUs and the core count, into $LOG
# pip's output goes to $LOG (set it first); on a failure the log is shown and the script exits.
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

pip_target() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$@" >>"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
}

pip_target_except() {
    local target=$1 folder=$2 name deps
    shift 2
    local filters=()
    for name in "$@"; do filters+=(-e "$name"); done
    mapfile -t deps < <(ls "$folder"/*.whl | grep -v "${filters[@]}")
    pip_target "$target" "${deps[@]}"
}

deepgemm_sites() {
    pip_target_except "$2" "$1" sgl_deep_gemm apache_tvm_ffi
    pip_target "$3" "$1"/sgl_deep_gemm-*.whl "$1"/apache_tvm_ffi-*.whl
}

vllm034_layout() {
    local v=$1
    mkdir -p "$v/vllm/third_party" "$v/vllm-0.34.0.dist-info"
    : >"$v/vllm/__init__.py"
    : >"$v/vllm/third_party/__init__.py"
    tar -xJf "$2" -C "$v/vllm/third_party" || exit 1
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n' \
        >"$v/vllm-0.34.0.dist-info/METADATA"
}

device_banner() {
    { nvidia-smi -L; nproc | sed 's/^/cores: /'; } 2>&1 | tee -a "$LOG"
}
