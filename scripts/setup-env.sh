#!/usr/bin/env bash
# Create .venv (if missing) and install torchrecord with its dev extra into it.
# torch is installed first, pinned: a bare "torch" requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q --no-compile torch==2.13.0  # no up-front byte-compiling of all of torch
python -m pip install -q -e '.[dev]'
