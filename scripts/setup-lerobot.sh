#!/usr/bin/env bash
# Create .venv-lerobot: LeRobot's LeRobotDataset (lerobot-dataset 0.4.4, import name ledataset) as the oracle
# of tests/lerobot/test_oracle.py (pytest -m lerobot) and of python -m benchmarks.lerobot.
#
# torch==2.13.0 first, pinned (never a bare torch: a multi-GB CUDA build); then the resolved set of
# scripts/lerobot/requirements.txt with --no-deps (the lock is complete); then tv_compat.py into the
# environment's site-packages (torchvision 0.28.0, the CUDA wheel, imports beside the CPU torch only after
# it). torchcodec, LeRobot's video decoder, needs FFmpeg's shared libraries from the system (Debian's
# FFmpeg 5.1: apt, as root). torchrecord itself is not installed: run from the checkout (python -m pytest,
# python -m benchmarks.lerobot put it on the path). Reuses an environment that has every pinned package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${LEROBOT_VENV:-.venv-lerobot}
LOCK=scripts/lerobot/requirements.txt

if [ "$(id -u)" = 0 ] && ! ldconfig -p | grep -q 'libavcodec.so.59'; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libavdevice59 libavfilter8 libavformat59 libavcodec59 libswscale6 libswresample4 libavutil57 > /dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
if ! python -c "import ledataset, torchcodec, av, lmdb" 2> /dev/null || ! pip freeze -q 2> /dev/null | grep -q '^lerobot-dataset==0.4.4$'; then
  python -m pip install -q --upgrade pip > /dev/null
  python -m pip install -q --no-compile torch==2.13.0
  python -m pip install -q --no-compile --no-deps -r "$LOCK"
fi
site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp scripts/lerobot/tv_compat.py "$site/tv_compat.py"
python - << 'PY'
import tv_compat  # noqa: F401  (before torchvision)
import ledataset.datasets.lerobot_dataset  # noqa: F401
import torchcodec.decoders  # noqa: F401  (loads the system's FFmpeg libraries)
import av, torch

print(f"lerobot environment: torch {torch.__version__}, PyAV {av.__version__}, torchcodec ok, ledataset ok")
PY
