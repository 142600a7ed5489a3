"""Batches of whole groups, planned with array operations: pure functions of the group offsets.

A grouped set of N samples is described by its offsets ``o`` (int64[G+1],
``o[0] = 0``, ``o[G] = N``, strictly increasing): group ``g`` is the rows
``[o[g], o[g+1])``. One epoch's plan is

1. a group order (a seeded permutation of the G groups, or the identity),
2. the sample order it implies (each group's rows in their stored order, groups
   one after another): one ``np.repeat`` and one ``np.arange``, no loop;
3. the batch boundaries, as indices into the permuted groups: every k-th group
   (``groups_per_batch``) or greedy filling up to ``max_samples`` samples, found by
   pointer doubling over the "next batch starts here" function, so the work is
   O(G log B) array operations for B batches whatever the group sizes;
4. each batch's group offsets (starting at 0), all batches in one array.

None of it runs a Python loop per sample or per group; :class:`torchrecord.GroupBatchIter`
only slices the arrays built here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord.errors import ArgumentError

__all__ = [
    "GroupPlan",
    "batch_bounds_by_count",
    "batch_bounds_by_samples",
    "check_offsets",
    "offsets_from_ids",
    "plan_epoch",
]


def check_offsets(groups: Any, rows: int) -> np.ndarray:
    """``groups`` as int64[G+1] offsets, checked against a data set of ``rows`` rows.

    Raises ValueError naming the first offset that is wrong and how to fix it.
    """
    offsets = np.asarray(groups.cpu() if hasattr(groups, "cpu") else groups)
    if offsets.ndim != 1 or len(offsets) == 0:
        raise ArgumentError(
            f"groups must be 1-D group offsets [0, ..., {rows}] (int64[G+1]), got shape {list(offsets.shape)}; "
            "to give one group id per sample, pass group_ids= instead"
        )
    if offsets.dtype.kind not in "iu":
        raise ArgumentError(f"groups must hold integer offsets, got dtype {offsets.dtype}")
    offsets = offsets.astype(np.int64, copy=False)
    if offsets[0] != 0 or offsets[-1] != rows:
        raise ArgumentError(
            f"groups must start at 0 and end at the number of rows ({rows}), got groups[0] = {offsets[0]} and "
            f"groups[-1] = {offsets[-1]}; offsets of G groups have G+1 entries, the last one the row count"
        )
    steps = np.diff(offsets)
    bad = np.flatnonzero(steps <= 0)
    if len(bad):
        g = int(bad[0])
        raise ArgumentError(
            f"groups must increase strictly: group {g} is rows [{offsets[g]}, {offsets[g + 1]}), which is "
            f"{'empty' if steps[g] == 0 else 'backwards'}; drop empty groups (np.unique(groups)) and give the "
            "offsets in increasing order"
        )
    return offsets


def offsets_from_ids(group_ids: Any, rows: int) -> np.ndarray:
    """The offsets of contiguous runs of equal ids, checked: an id that appears in two runs is an error.

    Raises ValueError naming the id and both row ranges, and saying how to sort the data.
    """
    ids = np.asarray(group_ids.cpu() if hasattr(group_ids, "cpu") else group_ids)
    if ids.ndim != 1 or len(ids) != rows:
        raise ArgumentError(f"group_ids must be one id per row: shape [{rows}], got {list(ids.shape)}")
    if ids.dtype.kind not in "iub":
        raise ArgumentError(
            f"group_ids must be integers, got dtype {ids.dtype}; number them first, e.g. "
            "torch.unique(ids, return_inverse=True)[1] keeps equal ids equal"
        )
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    offsets = np.concatenate(([0], starts, [rows])).astype(np.int64) if rows else np.zeros(1, np.int64)
    run_ids = ids[offsets[:-1]]
    by_id = np.argsort(run_ids, kind="stable")  # runs of one id end up adjacent, in row order
    repeat = np.flatnonzero(run_ids[by_id[1:]] == run_ids[by_id[:-1]])
    if len(repeat):
        # report the repetition that comes first in the rows
        second_runs = by_id[repeat + 1]
        i = int(repeat[np.argmin(second_runs)])
        first, second = int(by_id[i]), int(by_id[i + 1])
        raise ArgumentError(
            f"group id {run_ids[first].item()} appears in rows [{offsets[first]}, {offsets[first + 1]}) and again "
            f"in rows [{offsets[second]}, {offsets[second + 1]}); a group's samples must be contiguous: sort the "
            "data by group id first (order = torch.argsort(group_ids, stable=True), then index every field "
            "and group_ids with it)"
        )
    return offsets


def batch_bounds_by_count(groups: int, per_batch: int, drop_last: bool) -> np.ndarray:
    """Batch boundaries (indices into the group order) for ``per_batch`` groups a batch.

    The last batch holds the remaining ``groups % per_batch`` groups, or is dropped
    with ``drop_last``. Every group is in exactly one batch otherwise.
    """
    full = groups // per_batch
    bounds = np.arange(full + 1, dtype=np.int64) * per_batch
    if groups % per_batch and not drop_last:
        bounds = np.append(bounds, groups)
    return bounds


def batch_bounds_by_samples(offsets: np.ndarray, max_samples: int, drop_last: bool) -> np.ndarray:
    """Batch boundaries for greedy filling: whole groups while the batch holds at most ``max_samples``.

    ``offsets`` are the offsets of the groups in visiting order. A group larger
    than ``max_samples`` forms a batch alone. With ``drop_last`` the final batch
    is dropped when it holds fewer than ``max_samples`` samples.

    ``nxt[g]`` is where a batch starting at group ``g`` ends; the batch starts are
    the orbit 0, nxt[0], nxt[nxt[0]], ... computed for every step at once by
    pointer doubling (log2 of the batch count array operations).
    """
    groups = len(offsets) - 1
    if groups == 0:
        return np.zeros(1, np.int64)
    nxt = np.searchsorted(offsets, offsets[:-1] + max_samples, side="right") - 1
    nxt = np.maximum(nxt, np.arange(1, groups + 1))  # a group too big for a batch goes alone
    nxt = np.append(nxt, groups)  # the end is a fixed point
    # two consecutive batches always hold more than max_samples samples, which bounds the batch count
    most = min(groups, 2 * -(-int(offsets[-1]) // max_samples) + 1)
    steps = np.arange(most + 1, dtype=np.int64)
    where = np.zeros(most + 1, np.int64)  # where[t] = nxt applied t times to group 0
    jump = nxt
    for bit in range(max(1, int(most).bit_length())):
        take = (steps >> bit) & 1 == 1
        where[take] = jump[where[take]]
        jump = jump[jump]
    assert where[-1] == groups, "the batch count bound was too small"
    bounds = where[: int(np.searchsorted(where, groups)) + 1]
    if drop_last and len(bounds) > 1 and offsets[bounds[-1]] - offsets[bounds[-2]] < max_samples:
        bounds = bounds[:-1]
    return bounds


@dataclass(frozen=True)
class GroupPlan:
    """One epoch of group batches, as flat arrays.

    Attributes:
        order: int64[M], the rows in visiting order (M = rows in kept batches).
        batch_sizes: samples of each batch; the batches are consecutive slices of ``order``.
        offsets: every batch's group offsets (each starting at 0, ending at its size),
            concatenated; batch b's are ``offsets_sizes[b]`` entries.
        offsets_sizes: entries of ``offsets`` per batch (its group count plus one).
    """

    order: np.ndarray
    batch_sizes: list[int]
    offsets: np.ndarray
    offsets_sizes: list[int]


def plan_epoch(
    offsets: np.ndarray,
    permutation: np.ndarray | None,
    *,
    groups_per_batch: int | None,
    max_samples: int | None,
    drop_last: bool,
) -> GroupPlan:
    """The epoch's plan for groups ``offsets`` visited in ``permutation`` order (None: stored order)."""
    lengths = np.diff(offsets)
    if permutation is None:
        visited = offsets
        order = np.arange(offsets[-1], dtype=np.int64)
    else:
        lengths = lengths[permutation]
        visited = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        # row j of the new order is row j + (old start - new start) of its group
        shift = np.repeat(offsets[:-1][permutation] - visited[:-1], lengths)
        order = shift + np.arange(len(shift), dtype=np.int64)
    groups = len(offsets) - 1
    if groups_per_batch is not None:
        bounds = batch_bounds_by_count(groups, groups_per_batch, drop_last)
    else:
        assert max_samples is not None
        bounds = batch_bounds_by_samples(visited, max_samples, drop_last)
    starts = visited[bounds]
    order = order[: starts[-1]]
    counts = np.diff(bounds) + 1  # offsets entries per batch
    batch = np.repeat(np.arange(len(counts)), counts)
    first_entry = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    group = bounds[:-1][batch] + np.arange(len(batch)) - first_entry[batch]
    inner = visited[group] - starts[:-1][batch]
    return GroupPlan(order, np.diff(starts).tolist(), inner, counts.tolist())
