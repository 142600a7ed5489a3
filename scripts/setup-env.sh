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
python -m pip install -q --no-compile -e '.[dev]'  # modules compile on first import instead
# robomimic 0.3.0, the oracle of tests/test_robomimic*.py: --no-deps, because its metadata lists a bare
# torch, torchvision, tensorboard and egl_probe; robomimic.utils.dataset needs only torch, numpy, h5py,
# tqdm and termcolor (the dev extra)
python -m pip install -q --no-deps robomimic==0.3.0
