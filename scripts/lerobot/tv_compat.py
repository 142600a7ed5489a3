"""Make the PyPI torchvision wheel importable beside the CPU-only torch wheel (LeRobot's oracle environment).

The torchvision 0.28.0 wheel on PyPI is a CUDA build: its ``_C.so`` links
``libtorch_cuda.so``, which torch 2.13.0+cpu lacks, so the extension fails to
load and ``import torchvision`` then dies in ``_meta_registrations`` with
"operator torchvision::nms does not exist" (the fake registrations for nms and
qnms there are not guarded by ``_has_ops()``). Defining those two op schemas
first lets the pure-Python parts import, which is all LeRobot's dataset code
needs. Import this module before anything imports torchvision:
``scripts/setup-lerobot.sh`` copies it into the environment's site-packages,
so the oracle tests and ``python -m benchmarks.lerobot`` ``import tv_compat``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

_LIB: Any = None


def apply() -> bool:
    """Define the two schemas unless torchvision's own ops load; True when they were defined now."""
    global _LIB
    if _LIB is not None:
        return False
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    folder = os.path.dirname(spec.origin)
    found = [f for f in os.listdir(folder) if f.startswith("_C") and f.endswith(".so")]
    try:
        if found:
            torch.ops.load_library(os.path.join(folder, found[0]))
            return False  # the real ops are there: nothing to do
    except (OSError, ImportError, RuntimeError):
        pass
    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for name in ("nms", "qnms"):
        _LIB.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return True


PATCHED = apply()
