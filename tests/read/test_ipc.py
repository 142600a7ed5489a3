"""How batches leave a worker: one_storage (views of one storage), by_value (one pickled buffer), for_parent."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torchrecord._read.ipc import BY_VALUE_LIMIT, PACK_LIMIT, by_value, for_parent, one_storage


def test_small_batches_become_views_of_one_storage_with_equal_values() -> None:
    grid = torch.arange(16).view(4, 4)
    batch = {
        "data": {"x": torch.randn(4, 2, 3), "ids": grid[:, ::2], "names": [["a", None], [None, "b"]]},
        "mask": torch.tensor([[True, False], [False, True]]),
        "empty": torch.zeros(0, 5, dtype=torch.bfloat16),
    }
    packed = one_storage(batch)
    tensors = [packed["data"]["x"], packed["data"]["ids"], packed["mask"], packed["empty"]]
    originals = [batch["data"]["x"], batch["data"]["ids"], batch["mask"], batch["empty"]]
    for got, want in zip(tensors, originals):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert packed["data"]["names"] == batch["data"]["names"]


def test_large_batches_and_single_tensors_are_left_alone() -> None:
    big = {"a": torch.zeros(PACK_LIMIT // 4 + 1), "b": torch.zeros(3)}
    assert one_storage(big)["a"] is big["a"]
    single = {"a": torch.zeros(3), "n": 1}
    assert one_storage(single)["a"] is single["a"]


def _mixed_batch() -> dict[str, Any]:
    """Every kind of leaf: float, a strided view, bool, bfloat16, empty, 0-d, complex, str lists, an int."""
    grid = torch.arange(16).view(4, 4)
    rng = torch.Generator().manual_seed(0)
    return {
        "data": {"x": torch.randn(4, 2, 3, generator=rng), "ids": grid[:, ::2], "names": [["a", None], [None, "b"]]},
        "mask": torch.tensor([[True, False], [False, True]]),
        "half": torch.randn(3, 5, generator=rng).to(torch.bfloat16),
        "empty": torch.zeros(0, 5, dtype=torch.bfloat16),
        "scalar": torch.tensor(7, dtype=torch.int16),
        "complex": torch.randn(3, dtype=torch.complex64, generator=rng),
        "conjugated": torch.randn(3, dtype=torch.complex64, generator=rng).conj(),  # a lazy view (conj bit)
        "n": 3,
    }


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _assert_same(got[key], want[key])
    else:
        assert got == want


def test_by_value_pickles_as_one_buffer_and_unpickles_as_the_plain_batch() -> None:
    batch = _mixed_batch()
    data = ForkingPickler.dumps(by_value(batch))
    got = pickle.loads(data)
    assert type(got) is dict
    _assert_same(got, batch)
    tensors = [got["data"]["x"], got["data"]["ids"], got["mask"], got["half"], got["scalar"], got["complex"]]
    starts = [t.data_ptr() for t in tensors]
    span = max(t.data_ptr() + t.numel() * t.element_size() for t in tensors) - min(starts)
    assert span <= 64 * len(tensors) + sum(t.numel() * t.element_size() for t in tensors)  # one buffer, packed
    before = batch["data"]["x"].clone()
    got["data"]["x"].add_(1.0)  # writable (no read-only buffer warning), and not the worker's memory
    assert torch.equal(got["data"]["x"], before + 1.0) and torch.equal(batch["data"]["x"], before)


def test_for_parent_picks_by_size() -> None:
    small = {"a": torch.zeros(8), "b": torch.ones(2)}
    marked = for_parent(small)
    assert isinstance(marked, dict) and marked == small and type(marked) is not dict  # still the batch
    assert type(pickle.loads(ForkingPickler.dumps(marked))) is dict
    assert type(for_parent([torch.zeros(2), torch.ones(2)])).__name__ == "_ByValue"
    middle = {"a": torch.zeros(BY_VALUE_LIMIT // 4 + 1), "b": torch.ones(2)}
    slotted = for_parent(middle)  # above the limit: a shared-memory slot (a dict still)
    assert isinstance(slotted, dict) and type(slotted).__name__ == "_SlotDict"
    back = pickle.loads(ForkingPickler.dumps(slotted))
    assert type(back) is dict and torch.equal(back["a"], middle["a"]) and torch.equal(back["b"], middle["b"])
    big = {"a": torch.arange(PACK_LIMIT // 4 + 1, dtype=torch.float32), "b": torch.zeros(3)}
    back = pickle.loads(ForkingPickler.dumps(for_parent(big)))
    assert torch.equal(back["a"], big["a"])
    assert for_parent({"n": 1, "s": "text"}) == {"n": 1, "s": "text"}  # no tensors: as it is


class _Batches(IterableDataset[Any]):
    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        assert info is not None
        for i in range(info.id, 6, info.num_workers):
            batch = _mixed_batch()
            batch["n"] = i
            yield for_parent(batch)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_small_batches_cross_a_real_dataloader_by_value(context: str) -> None:
    loader = DataLoader(_Batches(), batch_size=None, num_workers=2, multiprocessing_context=context)
    got = list(loader)
    assert [b["n"] for b in got] == list(range(6))
    for batch in got:
        assert type(batch) is dict
        want = _mixed_batch()
        want["n"] = batch["n"]
        _assert_same(batch, want)
        assert not batch["mask"].is_shared()  # it came through the pipe, not through a shared-memory segment


class _Doubling(IterableDataset[Any]):
    def __iter__(self) -> Iterator[Any]:
        for i in range(4):
            yield for_parent({"x": torch.full((3,), float(i)), "i": i})


def test_a_collate_fn_in_the_worker_sees_a_dict() -> None:
    """DataLoader(batch_size=None, collate_fn=f) calls f on each item in the worker: it gets the dict it expects."""

    loader = DataLoader(_Doubling(), batch_size=None, num_workers=1, collate_fn=_double_x)
    got = list(loader)
    assert [b["i"] for b in got] == [0, 1, 2, 3]
    assert all(torch.equal(b["x"], torch.full((3,), 2.0 * b["i"])) for b in got)
    stacked = next(iter(DataLoader(_Doubling(), batch_size=2, num_workers=1)))  # default_collate of marked dicts
    assert torch.equal(stacked["x"], torch.tensor([[0.0] * 3, [1.0] * 3])) and stacked["i"].tolist() == [0, 1]


def _double_x(batch: dict[str, Any]) -> dict[str, Any]:
    return {"x": batch["x"] * 2, "i": batch["i"]}


def test_types_numpy_lacks_cross_by_value_bit_for_bit() -> None:
    rng = torch.Generator().manual_seed(1)
    batch = {
        "bf16_strided": torch.randn(4, 6, generator=rng).to(torch.bfloat16)[:, ::2],
        "f8": (torch.randn(3, 5, generator=rng) * 4).to(torch.float8_e4m3fn),
        "f8_fnuz": (torch.randn(7, generator=rng) * 4).to(torch.float8_e5m2fnuz),
    }
    got = pickle.loads(ForkingPickler.dumps(by_value(batch)))
    for key, want in batch.items():
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
        assert torch.equal(got[key].contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)), key


def _globals(data: bytes) -> set[str]:
    """The module.name globals a pickle refers to."""
    import pickletools

    found: set[str] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif op.name == "GLOBAL":
            found.add(str(arg).replace(" ", "."))
    return found


@pytest.mark.parametrize("handover", ["value", "slot"])
def test_batches_cross_with_dtype_names_and_every_dtype_comes_back(handover: str) -> None:
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16]
    dtypes += [torch.float32, torch.float64, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.uint16]
    batch = {str(d): torch.arange(6 * 1024).view(6, 1024).to(d) for d in dtypes}
    marked = by_value(batch) if handover == "value" else for_parent(batch)
    assert type(marked).__name__ == ("_ByValueDict" if handover == "value" else "_SlotDict")
    data = bytes(ForkingPickler.dumps(marked))
    assert not any(name.startswith("torch.") and not name.startswith("torchrecord.") for name in _globals(data))
    got = pickle.loads(data)
    for key, want in batch.items():
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
        assert torch.equal(got[key].view(torch.uint8), want.view(torch.uint8)), key
