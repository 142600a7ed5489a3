"""Per-sample mode without a second copy: a batch that is one chunk of the reader is collated as its column.

The reader splits each chunk's typed columns into samples (``split_columns``);
``torchrecord.collate`` in the process that reads (0 workers) recognises a
batch holding exactly one chunk's leaves, in order, and returns that column
instead of stacking a copy (``take_split_column``). These tests check that the
batches are the ones ``default_collate`` builds (values, dtypes, shapes) for
tensor, bfloat16, int, float and bool fields, that they share memory with the
samples only when the whole chunk is the batch, that a column is handed out
once, that the chunking never changes the order, and that every batch of an
epoch, kept, still holds its samples at the end.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import torchrecord
from torchrecord import RecordDataset, write_record

COUNT = 50
B = 8


def _sample(i: int) -> tuple[Any, ...]:
    vec = torch.arange(4, dtype=torch.float32) + i
    return vec, vec.to(torch.bfloat16), i, float(i) / 2, i % 3 == 0


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("columns") / "set.tr")
    write_record([_sample(i) for i in range(COUNT)], out)
    return out


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _same(a: Any, b: Any) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


def test_a_whole_chunk_is_collated_as_its_column(path: str) -> None:
    it = iter(RecordDataset(path, loader_batch_size=B, seed=1))
    samples = [next(it) for _ in range(B)]  # the first chunk, whole
    batch = torchrecord.collate(samples)
    _same(batch, default_collate(samples))
    assert batch[2].dtype == torch.int64 and batch[3].dtype == torch.float64 and batch[4].dtype == torch.bool
    assert batch[1].dtype == torch.bfloat16
    for field in (0, 1):  # the tensors are the samples' own rows: no copy
        assert _shares_memory(batch[field], samples[0][field])
    # handed out once: collating the same samples again stacks a copy of its own
    again = torchrecord.collate(samples)
    _same(again, batch)
    assert not _shares_memory(again[0], batch[0])


def test_part_of_a_chunk_or_a_reordered_one_is_stacked(path: str) -> None:
    it = iter(RecordDataset(path, loader_batch_size=B, seed=1))
    samples = [next(it) for _ in range(B)]
    part = torchrecord.collate(samples[: B - 1])
    _same(part, default_collate(samples[: B - 1]))
    assert not _shares_memory(part[0], samples[0][0])
    reordered = samples[::-1]
    batch = torchrecord.collate(reordered)
    _same(batch, default_collate(reordered))
    assert not _shares_memory(batch[0], samples[0][0])


def test_a_transformed_field_is_stacked_and_a_passed_one_is_not(path: str) -> None:
    def double_vec(sample: tuple[Any, ...]) -> tuple[Any, ...]:
        return (sample[0] * 2, *sample[1:])

    it = iter(RecordDataset(path, loader_batch_size=B, seed=1, transform=double_vec))
    samples = [next(it) for _ in range(B)]
    batch = torchrecord.collate(samples)
    _same(batch, default_collate(samples))
    assert not _shares_memory(batch[0], samples[0][0])  # made by the transform: stacked
    assert _shares_memory(batch[1], samples[0][1])  # passed through: the column


@pytest.mark.parametrize("chunk", [None, 1, 3, B, COUNT])
def test_the_chunk_never_changes_the_order(path: str, chunk: int | None) -> None:
    reference = [int(s[2]) for s in RecordDataset(path, seed=3)]
    ds = RecordDataset(path, seed=3, loader_batch_size=chunk)
    assert [int(s[2]) for s in ds] == reference
    loader = DataLoader(ds, batch_size=chunk or B, collate_fn=torchrecord.collate)
    assert [int(x) for b in loader for x in b[2]] == reference


def test_record_loader_reads_a_batch_at_a_time_and_keeps_every_batch_valid(path: str) -> None:
    no_copy: list[bool] = []

    def collate(samples: list[Any]) -> Any:
        batch = torchrecord.collate(samples)
        no_copy.append(_shares_memory(batch[0], samples[0][0]))
        return batch

    plain = list(DataLoader(RecordDataset(path, seed=5), batch_size=B, collate_fn=default_collate))
    loader = torchrecord.RecordLoader(RecordDataset(path, seed=5), batch_size=B, num_workers=0, collate_fn=collate)
    kept = list(loader)  # every batch of the epoch, kept until the end
    assert len(kept) == len(plain) == -(-COUNT // B)
    # RecordLoader reads one loader batch at a time; the short last batch ends the pass before it is
    # collated, and a pass that ended forgets its columns: stacked
    assert no_copy == [True] * (len(kept) - 1) + [COUNT % B == 0]
    for ours, theirs in zip(kept, plain, strict=True):
        _same(ours, theirs)
        for vec, label in zip(ours[0], ours[2].tolist(), strict=True):  # still the samples the file holds
            assert torch.equal(vec, _sample(label)[0])


def test_a_pass_that_ended_forgets_its_columns(path: str) -> None:
    samples = list(RecordDataset(path, loader_batch_size=COUNT))  # one chunk, the whole pass
    batch = torchrecord.collate(samples)
    _same(batch, default_collate(samples))
    assert not _shares_memory(batch[0], samples[0][0])


def test_a_plain_loader_without_the_batch_size_still_gets_the_right_batches(path: str) -> None:
    # chunks of the reader's own size (SAMPLE_CHUNK) do not line up with batches of 8: every batch stacked
    ds = RecordDataset(path, seed=5)
    ours = list(DataLoader(ds, batch_size=B, collate_fn=torchrecord.collate))
    theirs = list(DataLoader(RecordDataset(path, seed=5), batch_size=B, collate_fn=default_collate))
    for a, b in zip(ours, theirs, strict=True):
        _same(a, b)


def test_batch_mode_with_a_transform_takes_the_columns_it_passed_through(path: str) -> None:
    seen: list[torch.Tensor] = []

    def halve_float(sample: tuple[Any, ...]) -> tuple[Any, ...]:
        vec, bf, label, value, flag = sample
        seen.append(vec)
        return vec, bf, label, value / 2, flag

    plain = list(RecordDataset(path, batch_size=B, seed=2))
    ours = []
    for batch in RecordDataset(path, batch_size=B, seed=2, transform=halve_float):
        assert _shares_memory(batch[0], seen[-1])  # the column the samples' vectors are rows of: no copy
        ours.append(batch)
    assert len(ours) == len(plain)
    for a, b in zip(ours, plain, strict=True):
        assert torch.equal(a[3], b[3] / 2) and a[3].dtype == torch.float64  # made by the transform: collated
        _same(a[:3] + a[4:], b[:3] + b[4:])


def test_small_batches_gathered_several_at_once_are_views_with_each_fields_dtype(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch mode, plain: small batches a window serves whole are gathered together and split as tensor views
    of one tensor a field (``ShareReader.indexed_chunks(tensors=True)``); each holds its own samples, with
    every field's dtype (bfloat16 as its bits), and a batch changed in place leaves the next one as it was."""
    from torchrecord._read.reader import ShareReader

    path = str(tmp_path / "several.tr")
    write_record([(*_sample(i % 200), i) for i in range(3000)], path)
    several: list[int] = []
    real = ShareReader._chunks_at_once

    def counted(self: ShareReader, *args: Any) -> int:
        n = real(self, *args)
        several.append(n)
        return n

    monkeypatch.setattr(ShareReader, "_chunks_at_once", counted)
    batches = list(RecordDataset(path, batch_size=B, shuffle_buffer=512, seed=4))
    assert max(several) > 1  # the path under test ran
    seen = []
    for vec, half, i, f, flag, index in batches:
        assert (vec.dtype, half.dtype, i.dtype, f.dtype, flag.dtype) == (
            torch.float32,
            torch.bfloat16,
            torch.int64,
            torch.float64,
            torch.bool,
        )
        want = torch.stack([_sample(int(j) % 200)[0] for j in index])
        assert torch.equal(vec, want) and torch.equal(half, want.to(torch.bfloat16))
        assert torch.equal(i, index % 200) and torch.equal(flag, (index % 200) % 3 == 0)
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(3000))
    first, second = batches[0][0], batches[1][0].clone()
    first.fill_(-1)
    assert torch.equal(batches[1][0], second)
