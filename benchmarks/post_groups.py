"""The blog post's group iterator, reimplemented faithfully, defects included (for comparison only).

Source: "Mini-batching with in-memory datasets" (/work/shared/seeds/batchiter-in-memory-
minibatching.txt): groups are shuffled by sorting on ``(fnv_hash(group_id + seed), group_id)``
and cut into batches by padding the group start indices. Kept as written except
where the post's code does not run as printed:

* ``split_int_to_bytes`` is not shown in the post: here the element's bytes,
  least significant first (``element_size()`` of them);
* ``GroupBatchIter.__init__`` reads an undefined ``seed``: here its ``shuffle_seed``;
* ``torch.tensor(0x811c9dc5, dtype=torch.int32)`` overflows in current torch: here the
  same 32 bits as a negative int32;
* ``pad(..., mode="replicate")`` is refused for 1-D integer tensors by current
  torch: here the last entry is repeated with ``torch.cat``, which is what
  replicate padding does.

The defects torchrecord's :class:`torchrecord.GroupBatchIter` must not have (tests
in tests/memory/test_batches.py check both sides): ``len()`` counts one batch too many
when (G+1) mod batch_size is 0 or 1; the last groups are dropped otherwise; and
seed s+1 gives the seed-s order of the group ids shifted by one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["PostGroupBatchIter", "batch_endpoint_indices", "fnv_hash", "group_idx", "lexsort"]


def lexsort(*keys: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The post's lexsort (after PyTorch Geometric): the last key is the primary one."""
    if len(keys) == 0:
        raise ValueError(f"Must have at least 1 key, but {len(keys)=}.")
    idx = keys[0].argsort(dim=dim, stable=True)
    for k in keys[1:]:
        idx = idx.gather(dim, k.gather(dim, idx).argsort(dim=dim, stable=True))
    return idx


def _split_int_to_bytes(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [(tensor >> (8 * i)) & 0xFF for i in range(tensor.element_size())]


def fnv_hash(tensor: torch.Tensor) -> torch.Tensor:
    """The post's element-wise FNV hash (multiplications wrap in the tensor's integer type)."""
    fnv_prime = torch.tensor(0x01000193, dtype=torch.int32)
    fnv_offset = torch.tensor(0x811C9DC5 - (1 << 32), dtype=torch.int32)  # the same 32 bits, as int32
    hash_value = torch.full_like(tensor, int(fnv_offset))
    for byte in _split_int_to_bytes(tensor):
        hash_value = torch.bitwise_xor(hash_value * fnv_prime, byte)
    return hash_value


def group_idx(group_id: torch.Tensor) -> torch.Tensor:
    """Start index of every run of equal ids, plus the end."""
    _, counts = group_id.unique_consecutive(return_counts=True)
    idx = torch.cumsum(counts, dim=-1)
    return torch.nn.functional.pad(idx, (1, 0))


def batch_endpoint_indices(group_idx: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The post's batch boundaries: pad to a multiple of batch_size, take every batch_size-th entry."""
    padding = batch_size - (len(group_idx) - batch_size * (len(group_idx) // batch_size))
    group_idx = torch.cat([group_idx, group_idx[-1:].expand(padding)])  # pad(mode="replicate")
    start_points = group_idx[0:-1:batch_size]
    end_points = group_idx[batch_size::batch_size]
    return start_points, end_points


class PostGroupBatchIter:
    """The post's ``GroupBatchIter``: yields ``(group_id, *tensors)`` for batches of ``batch_size`` groups."""

    def __init__(
        self,
        group_id: torch.Tensor,
        *tensors: torch.Tensor,
        batch_size: int = 1,
        shuffle: bool = True,
        shuffle_seed: int = 42,
    ) -> None:
        self.group_id = group_id
        self.tensors = tensors
        if shuffle:
            self.idxs = lexsort(group_id, fnv_hash(group_id + shuffle_seed))
        else:
            self.idxs = torch.arange(len(group_id), device=group_id.device)
        group_start_indices = group_idx(group_id[self.idxs])
        self.batch_start, self.batch_end = batch_endpoint_indices(group_start_indices, batch_size)

    def __len__(self) -> int:
        return len(self.batch_start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        tensors = (self.group_id, *self.tensors)
        for start, end in zip(self.batch_start, self.batch_end):
            batch_idxs = self.idxs[start:end]
            if len(batch_idxs) > 0:
                yield tuple(x[batch_idxs, ...] for x in tensors)
