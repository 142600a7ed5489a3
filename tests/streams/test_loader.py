"""StreamLoader (the name RecordLoader has for streams): bundles of batches from real workers, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.streams.test_dataset import LENGTHS, _sequences
from torchrecord import RecordLoader, StreamDataset, StreamLoader, write_record

B = 4


@pytest.fixture(scope="module")
def packed_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("stream-loader") / "seqs.tr"
    write_record(_sequences(LENGTHS), path, group_by="seq", seed=3, samples_per_record=5, progress=False)
    return str(path)


def _assert_same_batches(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for key in ("mask", "start", "sequence"):
            assert torch.equal(a[key], b[key]), key
        assert a["data"].keys() == b["data"].keys()
        for name in b["data"]:
            assert torch.equal(a["data"][name], b["data"][name]), name


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_bundles_give_the_datasets_batches_in_order(packed_set: str, context: str) -> None:
    ds = StreamDataset(packed_set, batch_size=B, steps=1, seed=2)
    reference = list(ds)
    assert len(reference) > 30
    cases = [(2, None), (1, 4), (3, 7), (2, 1000)] if context == "fork" else [(2, 5)]
    for workers, bundle in cases:  # bundles that do not divide the epoch; one bundle larger than it
        loader = StreamLoader(ds, num_workers=workers, bundle=bundle, multiprocessing_context=context)
        assert len(loader) == len(reference)
        _assert_same_batches(list(loader), reference)


def test_no_workers_and_a_plain_dataloader_agree(packed_set: str) -> None:
    ds = StreamDataset(packed_set, batch_size=B, steps=3, seed=5)
    plain = list(DataLoader(ds, batch_size=None, num_workers=2))
    _assert_same_batches(list(StreamLoader(ds)), plain)
    _assert_same_batches(list(StreamLoader(ds, num_workers=2, bundle=3)), plain)


def test_persistent_workers_follow_set_epoch(packed_set: str) -> None:
    ds = StreamDataset(packed_set, batch_size=B, steps=2, seed=1)
    loader = StreamLoader(ds, num_workers=2, bundle=3, persistent_workers=True)
    for epoch in (0, 1, 0):
        loader.set_epoch(epoch)
        got = list(loader)
        alone = StreamDataset(packed_set, batch_size=B, steps=2, seed=1)
        alone.set_epoch(epoch)
        _assert_same_batches(got, list(alone))
    one, two = (
        StreamDataset(packed_set, batch_size=B, steps=2, seed=1),
        StreamDataset(packed_set, batch_size=B, steps=2, seed=1),
    )
    two.set_epoch(1)
    assert [b["sequence"].tolist() for b in one] != [b["sequence"].tolist() for b in two]


def test_resume_continues_with_another_number_of_workers(packed_set: str) -> None:
    ds = StreamDataset(packed_set, batch_size=B, steps=1, seed=4)
    reference = list(ds)
    loader = StreamLoader(ds, num_workers=2, bundle=4)
    taken = []
    for batch in loader:
        taken.append(batch)
        if len(taken) == 11:
            state = loader.state_dict()
            break
    assert state["batches"] == 11
    assert sum(row[2] for row in state["position"]["readers"]) == 11
    for workers, bundle in ((0, None), (3, 2)):
        resumed = StreamLoader(
            StreamDataset(packed_set, batch_size=B, steps=1, seed=4), num_workers=workers, bundle=bundle
        )
        resumed.load_state_dict(state)
        _assert_same_batches(taken + list(resumed), reference)
        _assert_same_batches(list(resumed), reference)  # the resume holds for one iteration


def test_a_state_for_other_streams_is_refused(packed_set: str) -> None:
    state = StreamLoader(StreamDataset(packed_set, batch_size=B, steps=1, seed=4)).state_dict()
    other = StreamLoader(StreamDataset(packed_set, batch_size=B + 1, steps=1, seed=4))
    with pytest.raises(ValueError, match="saved with streams=4, this dataset has 5"):
        other.load_state_dict(state)


def test_arguments_are_checked(packed_set: str, tmp_path: Path) -> None:
    ds = StreamDataset(packed_set, batch_size=B)
    assert StreamLoader is RecordLoader
    with pytest.raises(ValueError, match="does not take shuffle"):
        StreamLoader(ds, num_workers=2, shuffle=True)
    with pytest.raises(ValueError, match=r"RecordLoader\(batch_size=4\) is for per-sample mode"):
        StreamLoader(ds, num_workers=2, batch_size=4)
    with pytest.raises(ValueError, match="bundle must be an integer >= 1"):
        StreamLoader(ds, bundle=0)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        StreamLoader(ds, num_workers=-1)
    with pytest.raises(TypeError, match="reads torchrecord's reader datasets"):
        StreamLoader([1, 2, 3])  # type: ignore[arg-type]


def _ragged(s: dict[str, Any]) -> dict[str, Any]:
    """Leaves whose shape changes from frame to frame: batches hold nested lists, bundles cannot be stacked."""
    return {"x": torch.from_numpy(s["x"]), "tail": torch.zeros(int(s["t"]) % 3)}


def test_bundles_of_unstackable_batches_cross_as_lists(packed_set: str) -> None:
    ds = StreamDataset(packed_set, batch_size=B, steps=2, seed=3, transform=_ragged)
    reference = list(ds)
    assert any(isinstance(b["data"]["tail"], list) for b in reference)
    got = list(StreamLoader(ds, num_workers=2, bundle=4))
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert torch.equal(a["data"]["x"], b["data"]["x"]) and torch.equal(a["mask"], b["mask"])
        if isinstance(b["data"]["tail"], list):
            assert [[None if c is None else c.tolist() for c in row] for row in a["data"]["tail"]] == [
                [None if c is None else c.tolist() for c in row] for row in b["data"]["tail"]
            ]
        else:
            assert torch.equal(a["data"]["tail"], b["data"]["tail"])
