"""Run and import the scripts of examples/ from the engine tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def load_example(name: str) -> ModuleType:
    """Import examples/<name>.py as a module (for its dataset classes)."""
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_example(name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """Run examples/<name>.py in a fresh interpreter (this checkout first on its path); its output.

    Fails the test with the script's output when it exits with an error.
    """
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{name}.py exited with {proc.returncode}:\n{output[-6000:]}"
    return output


def assert_same_samples(got: Any, expected: Any) -> None:
    """Two record sets hold the same samples at every index (tensors equal, labels equal)."""
    assert len(got) == len(expected)
    for i in range(len(expected)):
        (x, y), (x0, y0) = got[i], expected[i]
        assert torch.equal(x, x0) and int(y) == int(y0), f"index {i}: {int(y)} != {int(y0)}"
