#!/usr/bin/env bash
# Set up .venv and run the test suite, the linters and the type checker (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
. .venv/bin/activate
ruff check torchrecord tests examples benchmarks scripts
ruff format --check torchrecord tests examples benchmarks scripts
mypy
# two test processes (pytest-xdist): the suite takes about half the time on 2 cores;
# TORCHRECORD_TEST_PROCESSES=0 runs it in this one process
python -m pytest -q -n "${TORCHRECORD_TEST_PROCESSES:-2}" "$@"
