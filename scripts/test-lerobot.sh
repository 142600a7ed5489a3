#!/usr/bin/env bash
# CI's lerobot leg: torchrecord.LeRobotDataset and from_lerobot against LeRobot itself (lerobot-dataset 0.4.4),
# in the oracle's environment (scripts/setup-lerobot.sh; SETUP=0 skips it when .ci/run already ran it).
# Runs exactly the tests marked lerobot (failing, not skipping, without the oracle), then the benchmark on a tiny dataset (that it runs; its figures mean nothing here).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SETUP:-1}" != 0 ]; then
  bash scripts/setup-lerobot.sh
fi
VENV=${LEROBOT_VENV:-.venv-lerobot}
# LeRobot and Hugging Face must not reach the network (nothing is downloaded; no cache outside the run)
hf=$(mktemp -d)
trap 'rm -rf "$hf"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME="$hf"
# TORCHRECORD_LEROBOT_LEG: a missing oracle fails the oracle tests instead of skipping them
TORCHRECORD_LEROBOT_LEG=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m lerobot --durations=5 tests/lerobot "$@"
"$VENV/bin/python" -m benchmarks.lerobot --tiny
