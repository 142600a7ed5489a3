"""one_storage: a small batch becomes views of one storage, equal to the original."""

from __future__ import annotations

import torch

from torchrecord._ipc import PACK_LIMIT, one_storage


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
