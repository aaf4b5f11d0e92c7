#!/usr/bin/env bash
# The test command: set up the machine (scripts/setup.sh: the virtualenv), lint, then run the
# whole suite (no GPU needed) with the virtualenv's Python. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${WARMD_VENV:-.venv}"
export PATH="$(cd "$VENV/bin" && pwd):$PATH" RAY_AUTH_MODE=disabled
ruff check warmd tests
python -m pytest -q -p no:cacheprovider "$@"
