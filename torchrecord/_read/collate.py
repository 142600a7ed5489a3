"""collate: ``default_collate`` whose batches leave a DataLoader worker through torchrecord's handover.

In per-sample mode the DataLoader collates in the worker. ``default_collate``
stacks each field into a fresh shared-memory segment made for that batch; the
main process then maps every one of them anew. :func:`collate` hands the batch
over the way torchrecord's batch mode does (``torchrecord._read.ipc.for_parent``:
by value when small, else a slot the worker reuses). A batch that will cross in
a slot is stacked straight into it (``torchrecord._read.ipc.slot_room``), so
the handover copies nothing; a smaller one is stacked into ordinary memory.
Outside a worker it is ``default_collate``, except that a batch which is exactly
one chunk the reader split into samples (a DataLoader batch size the dataset
knows: ``RecordLoader(batch_size=B)`` or ``loader_batch_size=B``) gets each
tensor or number field's column as it was read (``take_split_column``) instead
of a stacked copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map

from torchrecord._core.kinds import Place, take_split_column
from torchrecord._read.base import in_worker
from torchrecord._read.ipc import for_parent, slot_room

__all__ = ["collate"]


def _stack(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    whole = take_split_column(batch)  # the batch is one chunk the reader split: its column, not a copy
    return whole if whole is not None else torch.stack(list(batch), 0)


def _numbers(collate_numbers: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """default_collate's function for Python numbers, taking the column the numbers were split from first."""

    def collate_column(batch: Sequence[Any], *, collate_fn_map: Any = None) -> torch.Tensor:
        whole = take_split_column(batch)
        return whole if whole is not None else collate_numbers(batch, collate_fn_map=collate_fn_map)

    return collate_column


_COLLATE_MAP: dict[Any, Callable[..., Any]] = {
    **default_collate_fn_map,
    torch.Tensor: _stack,
    **{kind: _numbers(default_collate_fn_map[kind]) for kind in (int, float)},  # bools reach int's (a subclass)
}


def collate(samples: Sequence[Any]) -> Any:
    """Collate ``samples`` as ``torch.utils.data.default_collate`` does; in a DataLoader worker, hand the
    batch over through torchrecord's handover. Pass it as ``DataLoader(..., collate_fn=torchrecord.collate)``.
    """
    if not in_worker():
        return _collate(samples, collate_fn_map=_COLLATE_MAP)
    place = None
    if len(samples):
        sizes: list[int] = []
        _sizes(samples[0], len(samples), sizes, 0)
        place = slot_room(sizes) if sizes else None
    if place is None:
        return for_parent(_collate(samples, collate_fn_map=_COLLATE_MAP))
    return for_parent(_collate(samples, collate_fn_map=_placing(place)))


def _sizes(elem: Any, count: int, out: list[int], depth: int) -> None:
    """The bytes of each tensor that collating ``count`` samples like ``elem`` makes (default_collate's walk;
    an estimate: where the samples differ, a tensor that does not fit the room is copied into the slot)."""
    if isinstance(elem, torch.Tensor):
        out.append(count * elem.nbytes)
    elif isinstance(elem, (np.ndarray, np.bool_, np.number)):
        if elem.dtype.kind in "biufc":
            out.append(count * elem.nbytes)
    elif isinstance(elem, (bool, int, float)):
        out.append(count * 8)
    elif isinstance(elem, (str, bytes)) or depth > 32:
        return
    elif isinstance(elem, Mapping):
        for value in elem.values():
            _sizes(value, count, out, depth + 1)
    elif isinstance(elem, Sequence):
        for value in elem:
            _sizes(value, count, out, depth + 1)


def _placing(place: Place) -> dict[Any, Callable[..., Any]]:
    """A collate map that builds every tensor of the batch with ``place``: stacks straight into it, and
    copies there what another collate function made (numbers into a tensor)."""
    made: set[int] = set()

    def stack(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
        column = list(batch)
        first = column[0]
        if all(
            x.shape == first.shape and x.dtype == first.dtype and x.is_cpu and not x.requires_grad and x.is_contiguous()
            for x in column
        ):
            out = torch.stack(column, 0, out=place((len(column), *first.shape), first.dtype))
            made.add(id(out))
            return out
        return torch.stack(column, 0)

    def placed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(batch: Any, *, collate_fn_map: Any = None) -> Any:
            result = fn(batch, collate_fn_map=collate_fn_map)
            if (
                isinstance(result, torch.Tensor)
                and id(result) not in made
                and result.is_cpu
                and not result.requires_grad
            ):
                out = place(tuple(result.shape), result.dtype)
                out.copy_(result)
                made.add(id(out))
                return out
            return result

        return run

    return {key: stack if key is torch.Tensor else placed(fn) for key, fn in default_collate_fn_map.items()}
