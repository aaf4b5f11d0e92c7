#!/usr/bin/env bash
# The test command: set up the machine, lint, then run the whole suite (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE=disabled
ruff check warmd tests
python3 -m pytest -q -p no:cacheprovider "$@"
