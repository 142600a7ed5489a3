"""The one handover (torchrecord._read.slots through ipc.for_parent): batches in shared-memory slots.

Every streaming dataset in batch mode, in a real DataLoader with workers under
fork and spawn: every batch of an epoch is kept, and at the end each is compared
with the copy taken when it arrived (a slot reused too early would have changed
it) and with the samples it must hold. Slots are reused when batches are let go,
work with persistent workers, pin_memory and torchdata's StatefulDataLoader, and
batches changed by code in the worker still arrive as changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tests.robomimic_files import write_demo_file
from torchrecord import MixedDataset, RecordDataset, StreamDataset, WindowDataset, write_record
from torchrecord._core.structure import flatten
from torchrecord._read import ipc, slots
from torchrecord.convert import from_robomimic

pytestmark = pytest.mark.skipif(not slots.available(), reason="no memfd_create on this platform")

#: floats per sample: a batch of 8 is 64 KiB + a little, above ipc.BY_VALUE_LIMIT
WIDTH = 2048
COUNT = 96


def _sample(i: int) -> dict[str, Any]:
    return {"x": np.full(WIDTH, i, np.float32), "label": i}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("slots") / "plain.tr"
    write_record([_sample(i) for i in range(COUNT)], path, seed=1, progress=False)
    return str(path)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("slots") / "grouped.tr"
    frames = [{**_sample(i), "seq": i // 12} for i in range(COUNT)]
    write_record(frames, path, group_by="seq", seed=1, progress=False)
    return str(path)


@pytest.fixture(scope="module")
def robomimic_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("slots")
    write_demo_file(root / "demo.hdf5", [30, 25, 41], seed=2)
    from_robomimic(root / "demo.hdf5", root / "robo.tr", progress=False)
    return str(root / "robo.tr")


def _labels(batch: Any) -> list[int]:
    return [int(v) for v in batch["label"].reshape(-1).tolist()]


def _clone(batch: Any) -> list[Any]:
    return [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in flatten(batch)[1]]


def _equal(batch: Any, leaves: list[Any]) -> bool:
    now = flatten(batch)[1]
    return len(now) == len(leaves) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(now, leaves)
    )


def _kept_epoch(dataset: Any, context: str, **loader: Any) -> list[tuple[Any, list[Any]]]:
    """Every batch of an epoch as (the batch kept as it came, a clone of its leaves taken on arrival)."""
    out = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context, **loader):
        out.append((batch, _clone(batch)))
    return out


def _assert_kept_valid(kept: list[tuple[Any, list[Any]]]) -> None:
    for batch, copy in kept:
        assert type(batch) is dict
        assert _equal(batch, copy), "a batch changed after it arrived"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_record_dataset_batches_kept_for_an_epoch_stay_valid(plain: str, context: str) -> None:
    kept = _kept_epoch(RecordDataset(plain, batch_size=8, seed=2), context)
    _assert_kept_valid(kept)
    labels = [i for batch, _ in kept for i in _labels(batch)]
    assert sorted(labels) == list(range(COUNT))
    for batch, _ in kept:  # each sample's x is its label
        assert torch.equal(batch["x"], batch["label"].to(torch.float32)[:, None].expand(-1, WIDTH))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_mixed_dataset_batches_kept_stay_valid(plain: str, context: str) -> None:
    dataset = MixedDataset([plain, plain], batch_size=8, seed=2, stop="all_once")
    kept = _kept_epoch(dataset, context)
    _assert_kept_valid(kept)
    labels = [i for batch, _ in kept for i in _labels(batch)]
    assert sorted(labels) == sorted(list(range(COUNT)) * 2)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_stream_dataset_batches_kept_stay_valid(grouped: str, context: str) -> None:
    dataset = StreamDataset(grouped, steps=2, batch_size=4, seed=2)
    expected = [_clone(b) for b in DataLoader(dataset, batch_size=None)]
    kept = _kept_epoch(dataset, context)
    _assert_kept_valid(kept)
    assert len(kept) == len(expected)
    for (batch, _), want in zip(kept, expected):  # the stream's order holds with workers
        assert _equal(batch, want)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_window_dataset_batches_kept_stay_valid(
    robomimic_set: str, context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ipc.HANDOVER_ENV, "slot")  # its batches are small: force the slot path
    dataset = WindowDataset(robomimic_set, ["pos", "eef"], ["actions"], seq_length=3, batch_size=16, seed=2)
    reference = sorted(
        (b["actions"].flatten(1) for b in DataLoader(dataset, batch_size=None)), key=lambda t: t.sum().item()
    )
    kept = _kept_epoch(dataset, context)
    _assert_kept_valid(kept)
    rows = torch.cat([b["actions"].flatten(1) for b, _ in kept])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, torch.cat(reference).tolist()))


def test_slots_are_reused_when_batches_are_let_go(plain: str) -> None:
    dataset = RecordDataset(plain, batch_size=8, seed=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, prefetch_factor=2, persistent_workers=True)
    before = slots.mapped_segments()
    for epoch in range(3):
        dataset.set_epoch(epoch)
        labels = []
        for batch in loader:
            labels.extend(_labels(batch))
            del batch
        assert sorted(labels) == list(range(COUNT))
    # 36 batches over three epochs; each worker needs a handful of slots in flight at most
    assert slots.mapped_segments() - before <= 2 * 6


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_pin_memory_and_stateful_dataloader_resume(plain: str) -> None:
    tdn = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = RecordDataset(plain, batch_size=8, seed=2)
    loader = tdn.StatefulDataLoader(dataset, batch_size=None, num_workers=2, pin_memory=True)
    seen, state = [], None
    for step, batch in enumerate(loader):
        seen.extend(_labels(batch))
        if step == 4:
            state = loader.state_dict()
            break
    resumed = tdn.StatefulDataLoader(RecordDataset(plain, batch_size=8, seed=2), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in _labels(batch)]
    assert sorted(seen + rest) == list(range(COUNT))


def test_a_batch_changed_in_the_worker_arrives_changed(plain: str) -> None:
    def double(batch: dict[str, Any]) -> dict[str, Any]:
        batch["x"] = batch["x"] * 2  # a new tensor in the slot's dict: the dict must not pickle as the slot
        return batch

    dataset = RecordDataset(plain, batch_size=8, seed=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=double)
    for batch in loader:
        assert torch.equal(batch["x"][:, 0], batch["label"].to(torch.float32) * 2)


def test_handover_choice_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchrecord.errors import ArgumentError

    monkeypatch.setenv(ipc.HANDOVER_ENV, "shm")
    with pytest.raises(ArgumentError, match="TORCHRECORD_HANDOVER='shm'"):
        ipc.for_parent({"x": torch.zeros(3)})


def test_into_slot_keeps_every_leaf_kind() -> None:
    batch = {
        "f": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "e": torch.zeros((0, 4)),
        "s": torch.tensor(7),
        "name": ["a", "b"],
    }
    out = slots.into_slot(batch)
    assert type(out).__name__ == "_SlotDict"
    for key in ("f", "b", "e", "s"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key])
    assert out["name"] == ["a", "b"]


def test_views_of_a_segment_at_any_offset_equal_the_tensors_written_there() -> None:
    """The main process's views of a slot: aligned tensors through one typed tensor per dtype, tensors at an
    offset their itemsize does not divide through bytes; each equal to the tensor whose bytes lie there."""
    import ctypes

    tensors = [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor([True, False, True]),
        torch.arange(5, dtype=torch.int64) - 2,
        torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        torch.tensor(7, dtype=torch.int16),
        torch.arange(6, dtype=torch.float64).reshape(1, 2, 3),
        torch.zeros((0, 4)),
    ]
    owner = (ctypes.c_uint8 * 512)()
    raw = np.frombuffer(owner, dtype=np.uint8)
    specs: list[tuple[object, ...]] = []
    offset = 0
    for i, tensor in enumerate(tensors):
        offset += 1 if i % 2 else 0  # every other tensor at an odd offset
        data = tensor.reshape(-1).view(torch.uint8).numpy()
        raw[offset : offset + data.size] = data
        specs.append((offset, data.size, slots.dtype_name(tensor.dtype), tuple(tensor.shape)))
        offset += data.size
    specs.append(("not a tensor",))
    views = slots._views(owner, specs)
    assert views[-1] == "not a tensor"
    for tensor, view in zip(tensors, views):
        assert view.dtype == tensor.dtype and view.shape == tensor.shape and torch.equal(view, tensor)
    views[0][0, 0] = 100.0  # a view, not a copy
    assert np.frombuffer(owner, dtype=np.float32, count=1)[0] == 100.0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_per_sample_mode_with_torchrecord_collate(plain: str, context: str) -> None:
    from torchrecord import collate

    dataset = RecordDataset(plain, seed=2, loader_batch_size=8)
    kept = []
    for batch in DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate, multiprocessing_context=context):
        kept.append((batch, _clone(batch)))
    _assert_kept_valid(kept)
    labels = [i for batch, _ in kept for i in _labels(batch)]
    assert sorted(labels) == list(range(COUNT))
    plain_batches = list(DataLoader(dataset, batch_size=8, num_workers=0))  # the same batches as default_collate
    ours = list(DataLoader(dataset, batch_size=8, num_workers=0, collate_fn=collate))
    assert len(plain_batches) == len(ours)
    for a, b in zip(plain_batches, ours):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_a_batch_gathered_into_a_slot_crosses_without_a_copy() -> None:
    import pickle
    from multiprocessing.reduction import ForkingPickler

    arrays = slots.allocate(4, [12, 8])
    x = torch.from_numpy(arrays[0].view(np.float32).reshape(4, 3))
    y = torch.from_numpy(arrays[1].view(np.int64).reshape(4))
    x.copy_(torch.arange(12, dtype=torch.float32).reshape(4, 3))
    y.copy_(torch.arange(4))
    out = slots.into_slot({"x": x, "y": y, "name": "b"})
    assert out["x"] is x and out["y"] is y  # placed where it was gathered: no copy
    back = pickle.loads(ForkingPickler.dumps(out))
    assert torch.equal(back["x"], x) and torch.equal(back["y"], y) and back["name"] == "b"
    copied = slots.into_slot({"x": x.clone()})  # not in the allocated segment: copied into one
    assert copied["x"].data_ptr() != x.data_ptr()
