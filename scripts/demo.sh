#!/usr/bin/env bash
# Set up .venv and run the main job: a conventional folder-of-files loader against RecordDataset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
. .venv/bin/activate
python examples/compare_conventional.py "$@"
