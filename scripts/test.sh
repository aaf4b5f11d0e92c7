#!/usr/bin/env bash
# The test command: set up the machine (scripts/setup.sh: the virtualenv), lint, then run the
# whole suite (no GPU needed) with the virtualenv's Python, in 4 pytest-xdist worker processes
# (each with its own HOME, Ray temp dir and servers: tests/conftest.py), a whole test module
# per worker at a time, the slow ones first, at most two Ray clusters at once. Arguments go to pytest (`-n 0`: one process;
# docs/benchmarks.md, "Suite time", for how the worker count was chosen).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${WARMD_VENV:-.venv}"
export PATH="$(cd "$VENV/bin" && pwd):$PATH" RAY_AUTH_MODE=disabled
ruff check warmd tests scripts
python -m pytest -q -p no:cacheprovider -n 4 --dist loadscope --no-loadscope-reorder "$@"
