"""collate: ``default_collate`` whose batches leave a DataLoader worker through torchrecord's handover.

In per-sample mode the DataLoader collates in the worker. ``default_collate``
stacks each field into a fresh shared-memory segment made for that batch; the
main process then maps every one of them anew. :func:`collate` stacks into
ordinary memory and hands the batch over the way torchrecord's batch mode does
(``torchrecord._read.ipc.for_parent``: by value when small, else a slot the
worker reuses). Outside a worker it is ``default_collate`` with plain stacking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map

from torchrecord._read.base import in_worker
from torchrecord._read.ipc import for_parent

__all__ = ["collate"]


def _stack(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    return torch.stack(list(batch), 0)


_COLLATE_MAP = {**default_collate_fn_map, torch.Tensor: _stack}


def collate(samples: Sequence[Any]) -> Any:
    """Collate ``samples`` as ``torch.utils.data.default_collate`` does; in a DataLoader worker, hand the
    batch over through torchrecord's handover. Pass it as ``DataLoader(..., collate_fn=torchrecord.collate)``.
    """
    batch = _collate(samples, collate_fn_map=_COLLATE_MAP)
    return for_parent(batch) if in_worker() else batch
