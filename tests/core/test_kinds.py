"""Batch mode with a transform: the same default collation as without one, collate_fn, errors that name the sample."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from torchrecord import RecordDataset, RecordFile
from torchrecord.errors import SchemaError

COUNT = 40


def _rows(n: int) -> list[dict[str, Any]]:
    """Hugging Face-style rows: token ids of varying length, unicode text, an int label."""
    return [{"input_ids": torch.arange(i % 7 + 1), "text": f"ü {i}", "label": i} for i in range(n)]


@pytest.fixture
def rows(make_record: Callable[..., str]) -> str:
    return make_record(_rows(COUNT), schema={"input_ids": [None]})


@pytest.fixture
def images(make_record: Callable[..., str]) -> str:
    return make_record([(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(COUNT)])


def relabel(sample: dict[str, Any]) -> dict[str, Any]:
    """Touches one field, passes the others through."""
    return {**sample, "label": sample["label"] + 1000}


def test_variable_fields_collate_the_same_with_a_transform(rows: str) -> None:
    plain = next(iter(RecordDataset(rows, batch_size=8, shuffle=False)))
    transformed = next(iter(RecordDataset(rows, batch_size=8, shuffle=False, transform=relabel)))
    assert isinstance(plain["input_ids"], list) and isinstance(transformed["input_ids"], list)
    assert all(torch.equal(a, b) for a, b in zip(plain["input_ids"], transformed["input_ids"]))
    assert transformed["text"] == plain["text"] and isinstance(plain["text"], list)
    assert torch.equal(transformed["label"], plain["label"] + 1000) and transformed["label"].dtype == torch.int64


def identity(sample: Any) -> Any:
    return sample


@pytest.mark.parametrize("generic", [False, True])
def test_identity_transform_gives_exactly_the_untransformed_batches(images: str, generic: bool) -> None:
    a = RecordDataset(images, batch_size=16, shuffle=False)
    b = RecordDataset(images, batch_size=16, shuffle=False, transform=identity)
    b._force_generic = generic
    for x, y in zip(a, b):
        assert x[0].dtype == y[0].dtype == torch.uint8 and torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


def to_dict(sample: tuple[torch.Tensor, int]) -> dict[str, Any]:
    image, label = sample
    return {"x": image.float() / 255, "y": label, "name": f"#{label}", "crop": image[:, : label % 3 + 1]}


def test_a_transform_that_changes_the_structure(images: str) -> None:
    batch = next(iter(RecordDataset(images, batch_size=8, shuffle=False, transform=to_dict)))
    assert batch["x"].shape == (8, 3, 4, 4) and batch["x"].dtype == torch.float32
    assert batch["y"].dtype == torch.int64 and batch["name"] == [f"#{int(y)}" for y in batch["y"]]
    assert isinstance(batch["crop"], list), "tensors of different shapes stay a list"


def named(sample: tuple[torch.Tensor, int]) -> dict[str, Any]:
    return {"y": sample[1], "name": f"#{sample[1]}"}


def test_collate_fn(images: str, rows: str) -> None:
    batch = next(iter(RecordDataset(images, batch_size=8, collate_fn=default_collate, transform=named)))
    assert batch["name"] == [f"#{int(y)}" for y in batch["y"]]  # default_collate's lists of str

    def pad(samples: list[dict[str, Any]]) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], batch_first=True)

    padded = next(iter(RecordDataset(rows, batch_size=8, shuffle=False, collate_fn=pad)))
    assert padded.shape == (8, 7)
    with pytest.raises(ValueError, match="collate_fn is for batch mode"):
        RecordDataset(rows, collate_fn=pad)


def mixed(sample: tuple[torch.Tensor, int]) -> Any:
    return sample if sample[1] % 2 else {"odd": sample}


def test_different_structures_in_one_batch(images: str) -> None:
    with pytest.raises(SchemaError, match="different structures") as info:
        next(iter(RecordDataset(images, batch_size=8, transform=mixed)))
    assert images in str(info.value)


# -- errors raised by the user's functions name the sample ----------------------------------------


def fail_on_7(sample: Any) -> Any:
    label = sample[1] if isinstance(sample, tuple) else sample["label"]
    if label == 7:
        raise KeyError("no such label")
    return sample


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


needs_notes = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")


@needs_notes
@pytest.mark.parametrize("batch_size", [None, 8])
def test_transform_error_names_the_sample_and_keeps_its_type(images: str, batch_size: int | None) -> None:
    ds = RecordDataset(images, transform=fail_on_7, batch_size=batch_size)
    with pytest.raises(KeyError, match="no such label") as info:
        list(ds)
    note = _notes(info.value)
    index = int(note.split("failed on sample ")[1].split()[0])
    assert f"of {images}" in note
    assert RecordFile(images)[index][1] == 7, "the note names the very sample that failed"


@needs_notes
def test_transform_error_in_a_worker_names_the_sample(images: str) -> None:
    ds = RecordDataset(images, transform=fail_on_7)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(KeyError) as info:
        list(loader)
    message = str(info.value)
    assert "no such label" in message and "the transform failed on sample" in message and images in message


def fail_batch(batch: Any) -> Any:
    raise RuntimeError("bad batch")


@needs_notes
def test_batch_transform_and_collate_errors_name_the_batch(images: str) -> None:
    with pytest.raises(RuntimeError, match="bad batch") as info:
        next(iter(RecordDataset(images, batch_size=8, batch_transform=fail_batch)))
    assert "batch_transform failed on a batch of" in _notes(info.value) and "sample indices" in _notes(info.value)
    with pytest.raises(RuntimeError, match="bad batch") as info:
        next(iter(RecordDataset(images, batch_size=8, collate_fn=fail_batch)))
    assert "collating a batch of" in _notes(info.value)
