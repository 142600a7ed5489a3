"""Issue 20, point 8: arguments are checked where they are given, and never silently rounded.

Indices of records and groups are integers (``raw(1.5)`` used to escape as a bare
``struct.error``, ``group(1.9)`` to read group 1); seeds of every dataset are checked
when it is made; bytes paths work for readers as for writers.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import torchrecord
from tests.untrusted import write_set


def test_raw_and_group_take_integers_only(tmp_path: Path) -> None:
    path = str(tmp_path / "g.tr")
    torchrecord.write_record(
        [{"x": torch.tensor([i]), "g": i // 3} for i in range(9)],
        path,
        group_by="g",
        shuffle=False,
        samples_per_record=1,
        progress=False,
    )
    rf = torchrecord.RecordFile(path)
    for bad in (1.5, "1", True, None):
        with pytest.raises(TypeError, match=r"not an integer|a bool"):
            rf.raw(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"not an integer|a bool"):
            rf.group(bad)  # type: ignore[arg-type]
    assert rf.raw(np.int64(1)) == rf.raw(1) and [int(s["x"]) for s in rf.group(np.int32(2))] == [6, 7, 8]


def test_a_sharded_set_refuses_non_integer_indices(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    samples = [(torch.zeros(2), i) for i in range(20)]
    for s in range(2):
        torchrecord.write_shard(samples, folder, shard=s, num_shards=2, shuffle=False, progress=False)
    rf = torchrecord.open_set(folder)
    for bad in (1.9, "3", True):
        with pytest.raises(TypeError):
            rf[bad]
    assert rf[np.int64(3)][1] == 3


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_every_dataset_checks_its_seed_when_made(tmp_path: Path, seed: object) -> None:
    path = write_set(tmp_path / "set.tr", n=20)
    with pytest.raises((ValueError, TypeError)):
        torchrecord.RecordDataset(path, seed=seed)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError)):
        torchrecord.MixedDataset([path], seed=seed)  # type: ignore[arg-type]


def test_bytes_paths_read_like_str_paths(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=20)
    raw = os.fsencode(path)
    assert len(torchrecord.RecordFile(raw)) == 20
    assert len(list(torchrecord.RecordDataset(raw, batch_size=5))) == 4
    assert torchrecord.verify(raw, progress=False).ok
    assert len(torchrecord.RecordFile(raw, check="structure")) == 20
