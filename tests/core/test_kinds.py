"""Batch mode with a transform: the same default collation as without one, collate_fn, errors that name the sample."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
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


# -- a room: where a worker stacks a batch (torchrecord._read.ipc.slot_room), here one plain buffer ----------
class _Buffer:
    """A room of one uint8 buffer, handing out 64-byte aligned tensors in turn (as torchrecord._read.slots.room)."""

    def __init__(self) -> None:
        self.block = torch.empty(0, dtype=torch.uint8)
        self.sizes: list[int] = []

    def __call__(self, sizes: list[int]) -> Callable[[tuple[int, ...], torch.dtype], torch.Tensor]:
        self.sizes = sizes
        self.block = torch.zeros(sum(-(-s // 64) * 64 for s in sizes), dtype=torch.uint8)
        at = 0

        def place(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            nonlocal at
            size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
            if not size:
                return torch.empty(shape, dtype=dtype)
            out = self.block[at : at + size].view(dtype).view(shape)
            at += -(-size // 64) * 64
            return out

        return place

    def holds(self, tensor: torch.Tensor) -> bool:
        start = self.block.data_ptr()
        return tensor.nbytes == 0 or start <= tensor.data_ptr() < start + self.block.numel()


def _same_tree(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _same_tree(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same_tree(a, b)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    else:
        assert got == want


def _tensors(tree: Any) -> list[torch.Tensor]:
    from torchrecord._core.structure import flatten

    return [leaf for leaf in flatten(tree)[1] if isinstance(leaf, torch.Tensor)]


def _made(i: int) -> dict[str, Any]:
    return {
        "img": torch.full((3, 4, 4), i, dtype=torch.uint8),
        "half": torch.full((2,), i / 3).to(torch.bfloat16),
        "grid": np.full((2, 2), i, np.float32),
        "np_scalar": np.int16(i),
        "n": i,
        "x": i / 2,
        "flag": bool(i % 2),
        "ragged": torch.arange(i % 3 + 1),
        "name": f"s{i}",
        "empty": torch.zeros(0, 3),
        "mixed": torch.zeros(2, dtype=torch.float32 if i else torch.float64),  # dtypes differ: a list
    }


def test_a_room_gets_every_tensor_of_the_batch_and_the_batch_is_the_same(make_record: Callable[..., str]) -> None:
    from torchrecord._core.kinds import collate_any, collate_samples, collate_transformed

    samples = [_made(i) for i in range(6)]
    want = collate_any(samples, "here")
    room = _Buffer()
    got = collate_any(samples, "here", room)
    _same_tree(got, want)
    assert all(room.holds(t) for t in _tensors(got))
    assert not any(room.holds(t) for t in _tensors(want) if t.nbytes)
    assert len(room.sizes) == len(_tensors(want))

    written = [{k: v for k, v in s.items() if k not in ("mixed", "empty", "np_scalar")} for s in samples]
    stored = RecordFile(make_record(written, schema={"ragged": [None]}))
    sources = [stored[i] for i in range(len(samples))]
    made = [
        {**s, "mixed": m["mixed"], "np_scalar": m["np_scalar"], "more": s["img"] + 1} for s, m in zip(sources, samples)
    ]
    for collate in (
        lambda room: collate_transformed(made, sources, stored.schema, "here", room),
        lambda room: collate_samples(sources, stored.schema, room),
    ):
        room = _Buffer()
        got = collate(room)
        _same_tree(got, collate(None))
        assert all(room.holds(t) for t in _tensors(got))
        assert room.sizes


def test_a_room_that_declines_and_tensors_it_cannot_take() -> None:
    from torchrecord._core.kinds import collate_any

    samples = [{"w": torch.ones(3, requires_grad=True) * i, "v": torch.ones(2) * i} for i in range(4)]
    want = collate_any(samples, "here")
    _same_tree(collate_any(samples, "here", lambda sizes: None), want)  # fresh memory
    room = _Buffer()
    got = collate_any(samples, "here", room)
    _same_tree(got, want)
    assert got["w"].requires_grad and not room.holds(got["w"])  # autograd: stacked as always
    assert room.holds(got["v"])
