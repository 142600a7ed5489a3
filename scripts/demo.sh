#!/usr/bin/env bash
# Set up a light environment and run the main job: a conventional folder-of-files loader against RecordDataset.
#
# The job (examples/compare_conventional.py) needs torch, Pillow and tqdm, nothing of the dev extra:
# .venv-demo gets torch==2.13.0 first (pinned: a bare torch requirement can pull a multi-GB CUDA build),
# then this checkout with its `images` and `progress` extras, once (again only when setup.cfg changes).
# A .venv of scripts/setup-env.sh that already has all of it for this checkout is used as it is.
# Extra arguments go to the job (e.g. --count 2000, --cache warm).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NEEDS="import os, sys, torch, PIL, tqdm, torchrecord; sys.exit(not torchrecord.__file__.startswith(os.getcwd()))"

if [ -x .venv/bin/python ] && .venv/bin/python -I -c "$NEEDS" 2>/dev/null; then
  VENV=.venv
else
  VENV=.venv-demo
  stamp="$VENV/.torchrecord-demo"
  want=$(cksum < setup.cfg)
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
    || ! "$VENV/bin/python" -I -c "$NEEDS" 2>/dev/null; then
    start=$SECONDS
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --no-compile torch==2.13.0
    "$VENV/bin/python" -m pip install -q --no-compile -e '.[images,progress]'
    echo "$want" > "$stamp"
    echo "demo: $VENV set up in $((SECONDS - start))s (torch==2.13.0, then -e '.[images,progress]')"
  fi
fi
"$VENV/bin/python" examples/compare_conventional.py "$@"
