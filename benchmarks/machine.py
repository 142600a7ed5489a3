"""Describe the machine and the library versions a benchmark ran with."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

__all__ = ["describe_machine", "load_average", "versions"]

_PACKAGES = {
    "torch": "torch",
    "lmdb": "lmdb",
    "protobuf": "protobuf",
    "numpy": "numpy",
    "torchrecord": "torchrecord-lmdb",
    "msgpack": "msgpack",
    "webdataset": "webdataset",
    "lance": "pylance",
    "pyarrow": "pyarrow",
    "matplotlib": "matplotlib",
}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def describe_machine() -> dict[str, Any]:
    """CPU model, cores (logical and usable), RAM, OS and the load average now."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "ram_gib": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "load_average_at_start": load_average(),
    }


def versions() -> dict[str, str]:
    """Python's and every relevant package's version ("not installed" when absent)."""
    found = {"python": platform.python_version() + f" ({sys.implementation.name})"}
    for label, dist in _PACKAGES.items():
        try:
            found[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[label] = "not installed"
    try:
        import torchrecord
        from benchmarks.loaders.torchrecord_loader import library_digest

        found["torchrecord"] = f"{torchrecord.__version__} (source sha256 {library_digest()})"
    except ImportError:
        pass
    return found
