"""A process forked after its parent used torch's OpenMP threads reads a set (the read path uses no torch op
that could start OpenMP threads, which hang for good in such a child)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import torchrecord
from tests.untrusted import outcome


def _read(path: str, batch_size: int | None) -> int:
    ds = torchrecord.RecordDataset(path, batch_size=batch_size, shuffle=True, shuffle_buffer=64, seed=3)
    return sum(len(item["x"]) if batch_size else 1 for item in ds)


def test_a_child_forked_after_the_parents_openmp_threads_reads_long_and_short_records(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sets = {
        "long": [{"x": torch.from_numpy(rng.integers(0, 256, (64, 1024), dtype=np.uint8))} for _ in range(96)],
        "packed": [{"x": torch.from_numpy(rng.integers(0, 256, (3, 32, 32), dtype=np.uint8))} for _ in range(96)],
    }
    paths = {}
    for name, samples in sets.items():
        paths[name] = str(tmp_path / f"{name}.tr")
        extra = {"samples_per_record": 8} if name == "packed" else {}
        torchrecord.write_record(samples, paths[name], **extra)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        big = torch.randn(600, 600)
        assert float((big @ big).sum()) == float((big @ big).sum())  # OpenMP's threads run in this process
        for name, path in paths.items():
            for batch_size in (16, None):
                result = outcome(_read, path, batch_size, timeout=60)
                assert result.status == "returned" and result.value == 96, (name, batch_size, result)
    finally:
        torch.set_num_threads(threads)
