"""The writer's column path: many samples at a time, laid out as whole records of K samples.

Records written from columns must be byte for byte those of the per-sample
path, for every structure and every samples_per_record; a sample that does not
fit is still reported (or skipped) by its own index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import torchrecord
from tests.store.test_fastread import fixed_samples
from torchrecord._core.codec import encode_payloads
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Schema
from torchrecord._write.fastwrite import FastEncoder, fill_records
from torchrecord._write.sources import normalize
from torchrecord.errors import SourceError


def _values(path: Path) -> list[bytes]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=4)
    try:
        db = env.open_db(b"records", create=False)
        with env.begin(db=db) as txn:
            return [bytes(v) for v in txn.cursor().iternext(keys=False)]
    finally:
        env.close()


class Listed(torch.utils.data.Dataset[Any]):
    """A map-style dataset over a list (read one sample at a time)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class BatchedOnly(Listed):
    """Gives samples only through torch's batched protocol, ``__getitems__`` (after the first)."""

    def __getitem__(self, i: int) -> Any:
        if getattr(self, "first_done", False):
            raise AssertionError("read one by one: __getitems__ was not used")
        self.first_done = True
        return self.items[i]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [self.items[i] for i in indices]


@settings(max_examples=100, deadline=None)
@given(fixed_samples(), st.integers(1, 5), st.integers(1, 7))
def test_columns_make_the_per_sample_records(sample: Any, n: int, k: int) -> None:
    norm = normalize(sample)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    if encoder is None:
        return
    samples = [sample] * (n * k)
    columns = encoder.columns(samples)
    assert columns is not None
    single = fill_records(encoder.layout, columns)
    assert [bytes(r) for r in single] == [encoder.encode(s) for s in samples]
    chunked = FixedLayout.build(Schema.from_first(norm.tree, norm.signatures), k)
    assert chunked is not None
    records = fill_records(chunked, columns)
    for j, record in enumerate(records):
        rows = [c[j * k : (j + 1) * k] if k > 1 else c[j] for c in columns]
        assert bytes(record) == encode_payloads(rows, norm.signatures)


def test_columns_refuse_samples_that_do_not_fit() -> None:
    first = (torch.zeros(3), 1)
    norm = normalize(first)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    assert encoder.columns([first, (torch.zeros(3, dtype=torch.float64), 2)]) is None
    assert encoder.columns([first, (torch.zeros(4), 2)]) is None
    assert encoder.columns([first, (torch.zeros(3), 2.5)]) is None
    assert encoder.columns([first, [torch.zeros(3), 2]]) is None
    assert encoder.columns([first, (torch.zeros(3), 2**70)]) is None
    assert encoder.columns([first, (torch.zeros(3, requires_grad=True), 2)]) is None
    got = encoder.columns([first, (torch.arange(6.0)[::2], 7)])  # not contiguous: stacked all the same
    assert got is not None and got[0].tolist() == [[0, 0, 0], [0, 2, 4]] and got[1].tolist() == [1, 7]


@pytest.mark.parametrize("k", [1, 3, 64])
@pytest.mark.parametrize("count", [1, 2, 203])
def test_map_style_writes_the_records_of_the_per_sample_path(tmp_path: Path, k: int, count: int) -> None:
    rng = np.random.default_rng(0)
    items = [
        {"a": rng.integers(0, 9, (2, 3)).astype(np.int16), "b": bool(i % 2), "c": float(i), "l": [1, 2, i]}
        for i in range(count)
    ]
    # an iterable goes through the per-sample path (spooled and replayed in the same seeded order)
    torchrecord.write_record(Listed(items), tmp_path / "m.tr", samples_per_record=k, progress=False)
    torchrecord.write_record(iter(items), tmp_path / "i.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "m.tr") == _values(tmp_path / "i.tr")


@pytest.mark.parametrize("k", [1, 5])
def test_tensor_datasets_and_arrays_are_read_as_columns(tmp_path: Path, k: int) -> None:
    features, labels = torch.randn(301, 4), torch.arange(301)
    torchrecord.write_record(TensorDataset(features, labels), tmp_path / "t.tr", samples_per_record=k, progress=False)
    samples = [(features[i], labels[i]) for i in range(301)]
    torchrecord.write_record(iter(samples), tmp_path / "ti.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "t.tr") == _values(tmp_path / "ti.tr")
    torchrecord.write_record(features.numpy(), tmp_path / "a.tr", samples_per_record=k, progress=False)
    torchrecord.write_record(iter(list(features.numpy())), tmp_path / "ai.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "a.tr") == _values(tmp_path / "ai.tr")
    back = torchrecord.RecordFile(tmp_path / "t.tr")
    assert sorted(int(label) for _, label in back) == list(range(301))


def test_getitems_is_used_when_the_dataset_has_it(tmp_path: Path) -> None:
    items = [(torch.full((2,), i, dtype=torch.int32), i) for i in range(500)]
    torchrecord.write_record(BatchedOnly(items), tmp_path / "b.tr", samples_per_record=4, progress=False)
    assert sorted(label for _, label in torchrecord.RecordFile(tmp_path / "b.tr")) == list(range(500))


class FailsAt(Listed):
    def __init__(self, items: list[Any], bad: set[int]) -> None:
        super().__init__(items)
        self.bad = bad

    def __getitem__(self, i: int) -> Any:
        if i in self.bad:
            raise ValueError(f"cannot read {i}")
        return self.items[i]


@pytest.mark.parametrize("k", [1, 7])
def test_a_bad_sample_in_a_batch_is_skipped_by_its_index(tmp_path: Path, k: int) -> None:
    items = [(torch.full((3,), i, dtype=torch.int64), i) for i in range(1000)]
    bad = {0, 5, 640, 999}
    path = tmp_path / "s.tr"
    rf = torchrecord.write_record(
        FailsAt(items, bad), path, samples_per_record=k, shuffle=False, on_error="skip", progress=False
    )
    assert rf.write_summary.skipped == len(bad)
    good = [s for i, s in enumerate(items) if i not in bad]
    torchrecord.write_record(iter(good), tmp_path / "g.tr", samples_per_record=k, shuffle=False, progress=False)
    assert _values(path) == _values(tmp_path / "g.tr")
    with pytest.raises(SourceError, match="640"):
        torchrecord.write_record(FailsAt(items, {640}), tmp_path / "r.tr", samples_per_record=k, progress=False)
