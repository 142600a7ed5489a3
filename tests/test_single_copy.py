"""Long records are copied once, from the map into the batch, in the same order as before.

Batches that span two windows are filled in place (no joining copy); per-sample
mode reads small chunks, so a sample does not keep a chunk of hundreds of
large samples alive; every path gives the same samples as the checked
protobuf decoder, in the per-window order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchrecord
from torchrecord._read.items import SAMPLE_CHUNK_BYTES
from torchrecord._store.fastread import JOIN_LIMIT

SIDE = 80  # 3*80*80 = 19,200 bytes: long records (kept as views of the map)
COUNT = 300  # more than SAMPLE_CHUNK_BYTES of samples


class Large(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(np.random.default_rng(i).integers(0, 256, (3, SIDE, SIDE), dtype=np.uint8))
        return image, i


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("large") / "large.tr"
    torchrecord.write_record(Large(), path, progress=False)
    assert 3 * SIDE * SIDE >= JOIN_LIMIT
    return path


def _generic(ds: torchrecord.RecordDataset) -> torchrecord.RecordDataset:
    ds._force_generic = True
    return ds


@pytest.mark.parametrize("batch", [7, 16, 64])
def test_batches_spanning_windows_match_the_checked_decoder(large: Path, batch: int) -> None:
    # a window of 40 samples: most batch sizes make batches that span two windows
    fast = list(torchrecord.RecordDataset(large, batch_size=batch, shuffle_buffer=40, seed=3))
    slow = list(_generic(torchrecord.RecordDataset(large, batch_size=batch, shuffle_buffer=40, seed=3)))
    assert len(fast) == len(slow) == -(-COUNT // batch)
    for (fx, fy), (sx, sy) in zip(fast, slow):
        assert torch.equal(fy, sy) and torch.equal(fx, sx)
        assert fx.is_contiguous() and fx.shape == (len(fy), 3, SIDE, SIDE)
    reference = Large()
    for x, y in fast:
        for image, label in zip(x, y.tolist()):
            assert torch.equal(image, reference[label][0])


def test_batches_own_their_memory(large: Path) -> None:
    """A batch is a fresh array: changing it changes no other batch, and no later epoch."""
    ds = torchrecord.RecordDataset(large, batch_size=16, shuffle_buffer=40, seed=1)
    first = list(ds)
    for x, _ in first:
        x.zero_()
    again = list(ds)
    assert all(x.any() for x, _ in again)


def test_per_sample_mode_reads_small_chunks(large: Path) -> None:
    samples = list(torchrecord.RecordDataset(large, seed=2))
    assert sorted(label for _, label in samples) == list(range(COUNT))
    # each sample is a view of the chunk it was gathered into: chunks are bounded in bytes
    storage = max(x.untyped_storage().nbytes() for x, _ in samples)
    assert storage <= max(SAMPLE_CHUNK_BYTES, 3 * SIDE * SIDE)
    batched = [
        label for _, labels in torchrecord.RecordDataset(large, seed=2, batch_size=10) for label in labels.tolist()
    ]
    assert [label for _, label in samples] == batched  # the same order in both modes
