#!/usr/bin/env bash
# Set up .venv and run the test suite, the linters and the type checker (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
. .venv/bin/activate
ruff check torchrecord tests examples benchmarks scripts
ruff format --check torchrecord tests examples benchmarks scripts
mypy
python -m pytest -q "$@"
