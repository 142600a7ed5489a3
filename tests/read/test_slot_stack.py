"""Batches collated in a DataLoader worker are stacked straight into the slot they leave in (no second copy).

Batch mode with a transform (``Items.batch`` -> ``collate_transformed``), batch
mode on a set with variable fields (``collate_samples``) and per-sample mode
with ``torchrecord.collate`` build a batch that crosses in a slot inside that
slot (``torchrecord._read.ipc.slot_room``), so ``into_slot`` takes it as it is.
Every batch of an epoch is kept and compared, sample by sample, with the
batches of the same dataset read without workers; a counter that the workers
fill shows which path ``into_slot`` took.
"""

from __future__ import annotations

import functools
import multiprocessing
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from torchrecord import RecordDataset, write_record
from torchrecord._core.schema import Schema
from torchrecord._read import ipc, slots
from torchrecord._read.items import Items

pytestmark = pytest.mark.skipif(not slots.available(), reason="no memfd_create on this platform")

COUNT = 64
SIDE = 64  # uint8[3, 64, 64]: a batch of 8 is 96 KiB of images, more than ipc.BY_VALUE_LIMIT (2 of them less)


def _sample(i: int) -> dict[str, Any]:
    gen = np.random.default_rng(i)
    return {
        "img": torch.from_numpy(gen.integers(0, 256, (3, SIDE, SIDE), dtype=np.uint8)),
        "label": i,
        "vec": gen.standard_normal(4).astype(np.float32),
        "name": f"sample-{i}",
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("slot_stack") / "images.tr"
    write_record([_sample(i) for i in range(COUNT)], path, seed=1, progress=False)
    return str(path)


def made(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform that passes some leaves through and makes others of every kind the collation knows."""
    i = sample["label"]
    return {
        "img": sample["img"],
        "label": i,
        "vec": sample["vec"],
        "name": sample["name"],
        "score": i / 4,
        "flag": i % 2 == 0,
        "small": torch.full((5,), i, dtype=torch.int16),
        "half": torch.full((3,), i / 8).to(torch.bfloat16),
        "grid": np.full((2, 3), i, np.float64),
        "np_scalar": np.int32(i),
        "ragged": torch.arange(i % 3 + 1, dtype=torch.float32),
        "flipped": sample["img"].flip(-1),
    }


def made_even(sample: dict[str, Any]) -> dict[str, Any]:
    """:func:`made` without its ragged leaf (``default_collate`` stacks every tensor)."""
    out = made(sample)
    del out["ragged"]
    return out


def as_float(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "img": batch["img"].float() / 255}


def _rows(batches: list[Any]) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Each sample's row of every leaf, by label, and the batches' kinds of leaves (the same in every batch)."""
    rows: dict[int, dict[str, Any]] = {}
    kinds: dict[str, Any] = {}
    for batch in batches:
        assert type(batch) is dict
        now = {
            k: (type(v), v.dtype, tuple(v.shape[1:])) if isinstance(v, torch.Tensor) else (type(v),)
            for k, v in batch.items()
        }
        assert not kinds or now == kinds
        kinds = now
        for i, label in enumerate(batch["label"].tolist()):
            rows[int(label)] = {k: v[i] for k, v in batch.items()}
    return rows, kinds


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _clone(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.clone() if isinstance(v, torch.Tensor) else [x.clone() if isinstance(x, torch.Tensor) else x for x in v]
        for k, v in batch.items()
    }


def _assert_same_batches(got: list[Any], want: list[Any]) -> None:
    got_rows, got_kinds = _rows(got)
    want_rows, want_kinds = _rows(want)
    assert got_kinds == want_kinds
    assert sorted(got_rows) == sorted(want_rows) == list(range(COUNT))
    for label, row in want_rows.items():
        assert row.keys() == got_rows[label].keys()
        for key, value in row.items():
            assert _same(got_rows[label][key], value), (label, key)


def _assert_kept_valid(kept: list[tuple[Any, Any]]) -> None:
    for batch, copy in kept:
        assert batch.keys() == copy.keys()
        for key in batch:
            if isinstance(batch[key], torch.Tensor):
                assert torch.equal(batch[key], copy[key]), f"{key} of a kept batch changed after it arrived"
            else:
                assert all(_same(a, b) for a, b in zip(batch[key], copy[key]))


# -- which path into_slot took, counted in the workers ------------------------------------------------------
def count_handovers(counter: Any, worker_id: int) -> None:
    """worker_init_fn: count into ``counter`` [in place, copied] the batches into_slot hands over."""
    original = slots._in_place

    def counted(pool: Any, leaves: list[Any], whole_arena: bool) -> Any:
        placed = original(pool, leaves, whole_arena)
        with counter.get_lock():
            counter[0 if placed is not None else 1] += 1
        return placed

    slots._in_place = counted  # type: ignore[assignment]


def _counted_epoch(loader_args: dict[str, Any], context: str, **loader: Any) -> tuple[list[Any], list[int]]:
    """Every batch of an epoch as (batch, clone taken on arrival), and the workers' [in place, copied] counts."""
    ctx = multiprocessing.get_context(context)
    counter = ctx.Array("i", 2)
    kept = []
    for batch in DataLoader(
        **loader_args,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=functools.partial(count_handovers, counter),
        **loader,
    ):
        kept.append((batch, _clone(batch)))
    return kept, list(counter)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batch_mode_with_a_transform_is_stacked_in_the_slot(images: str, context: str) -> None:
    dataset = RecordDataset(images, batch_size=8, transform=made, seed=3)
    kept, (in_place, copied) = _counted_epoch({"dataset": dataset, "batch_size": None}, context)
    assert (in_place, copied) == (COUNT // 8, 0)  # every batch crossed where it was stacked
    _assert_kept_valid(kept)
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=None, num_workers=0)))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_per_sample_mode_with_torchrecord_collate_is_stacked_in_the_slot(images: str, context: str) -> None:
    dataset = RecordDataset(images, transform=made_even, seed=3, loader_batch_size=8)
    args = {"dataset": dataset, "batch_size": 8, "collate_fn": torchrecord.collate}
    kept, (in_place, copied) = _counted_epoch(args, context)
    assert (in_place, copied) == (COUNT // 8, 0)
    _assert_kept_valid(kept)
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=8, num_workers=0)))


def test_variable_fields_without_a_transform_are_stacked_in_the_slot(images: str) -> None:
    dataset = RecordDataset(images, batch_size=8, seed=3)  # a str field: the generic path, collate_samples
    kept, (in_place, copied) = _counted_epoch({"dataset": dataset, "batch_size": None}, "fork")
    assert (in_place, copied) == (COUNT // 8, 0)
    _assert_kept_valid(kept)
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=None, num_workers=0)))


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_pin_memory(images: str) -> None:
    dataset = RecordDataset(images, batch_size=8, transform=made, seed=3)
    kept, (in_place, copied) = _counted_epoch({"dataset": dataset, "batch_size": None}, "fork", pin_memory=True)
    assert (in_place, copied) == (COUNT // 8, 0)
    _assert_kept_valid(kept)
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=None, num_workers=0)))


def test_a_batch_transform_that_makes_new_leaves_is_copied(images: str) -> None:
    dataset = RecordDataset(images, batch_size=8, transform=made, batch_transform=as_float, seed=3)
    kept, (in_place, copied) = _counted_epoch({"dataset": dataset, "batch_size": None}, "fork")
    assert (in_place, copied) == (0, COUNT // 8)  # its float images lie outside the slot: copied there
    _assert_kept_valid(kept)
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=None, num_workers=0)))


def test_small_batches_still_cross_by_value(images: str) -> None:
    dataset = RecordDataset(images, batch_size=2, transform=made_even, seed=3)  # 2 x 24 KiB: by value
    kept, counts = _counted_epoch({"dataset": dataset, "batch_size": None}, "fork")
    assert counts == [0, 0]  # no slot at all
    _assert_same_batches([b for b, _ in kept], list(DataLoader(dataset, batch_size=None, num_workers=0)))


def test_a_collated_batch_crosses_where_it_was_stacked(images: str) -> None:
    schema = RecordDataset(images).file.schema
    assert isinstance(schema, Schema)
    samples = [_sample(i) for i in range(8)]
    items = Items(images, schema, transform=made, batch_size=8, room=ipc.slot_room)
    batch = items.batch(samples, False)
    out = ipc.for_parent(batch)
    assert type(out).__name__ == "_SlotDict"
    for key, value in batch.items():  # placed where it was stacked: the very same objects, no copy
        assert out[key] is value
    plain = Items(images, schema, transform=made, batch_size=8).batch(samples, False)
    assert plain.keys() == batch.keys()
    for key in plain:
        if isinstance(plain[key], torch.Tensor):
            assert _same(batch[key], plain[key])
            assert plain[key].data_ptr() != batch[key].data_ptr()
        else:
            assert all(_same(a, b) for a, b in zip(batch[key], plain[key]))
