"""LeRobotDataset's items as a stream for training loops: shuffled windows, workers, ranks, resume, batches.

The items are :class:`~torchrecord.LeRobotDataset`'s, value for value. The
reader contract (``torchrecord._read.base``) deals them out: blocks of
consecutive items in a seeded order per epoch, split over ranks and DataLoader
workers, each reader's share permuted window by window
(``torchrecord._order.share``). Every camera frame a window's items need (their
``delta_timestamps`` windows overlap) is read from the set once per window, and
batches are gathered from those frames in the reader, column by column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from torchrecord._lerobot.dataset import LeRobotDataset
from torchrecord._order import partition as _partition
from torchrecord._order.plan import Part, Reader
from torchrecord._order.share import Share, SharePlan
from torchrecord._read.base import ReaderDataset
from torchrecord._read.items import SAMPLE_CHUNK, Items
from torchrecord._read.state import Start
from torchrecord._shards.open import SetLike
from torchrecord._store.checked import Check

__all__ = ["LeRobotStreamDataset"]

#: A window's camera frames read from the set stay near this many bytes.
WINDOW_BYTES = 64 << 20

#: consecutive items of one window: where each key reads, their ``<key>_is_pad`` masks, the window's camera frames
_Part = tuple[dict[str, np.ndarray], dict[str, torch.Tensor], dict[str, tuple[np.ndarray, np.ndarray]]]


class LeRobotStreamDataset(ReaderDataset):
    """:class:`~torchrecord.LeRobotDataset`'s items, shuffled per epoch, sharded, batched in the reader.

    The same items as ``LeRobotDataset(path, delta_timestamps=..., episodes=...)``
    (every key, ``*_is_pad`` and ``task`` included), each once per epoch, in a
    seeded order that changes with :meth:`set_epoch`; in batch mode a batch is
    what ``torch.utils.data.default_collate`` makes of its items (tensors
    stacked, ``task`` a list of strings), built straight from the frames without
    making the items. Use ``DataLoader(ds, batch_size=None, num_workers=n)`` or
    ``torchrecord.RecordLoader(ds, num_workers=n)`` (whose state resumes every
    rank, on any number of ranks and workers).

    Args:
        path: a set written by ``torchrecord.convert.from_lerobot``.
        delta_timestamps, episodes, image_transforms, tolerance_s: as for
            :class:`~torchrecord.LeRobotDataset`.
        batch_size: yield batches of this many items; None yields items.
        shuffle: a new item order every epoch (False: stored order).
        shuffle_buffer: items mixed (and their frames read) at a time per reader,
            capped so that their camera frames stay near 64 MiB; at least one batch.
        block_size: items per block of the per-epoch block order (default: about
            items/256, within [16, 4096]).
        seed: the base seed of the order.
        drop_last: ranks cut the remainder instead of repeating items from the
            epoch's start; in batch mode each reader drops its last short batch.
        transform: called on each item after the shuffle (batch mode: the items
            are then made and collated by what they hold, or by ``collate_fn``).
        batch_transform: called on each batch (batch mode).
        collate_fn: batch mode: turns the list of (transformed) items into a batch.
        loader_batch_size: per-sample mode: the DataLoader's ``batch_size``, so
            worker shares are cut on whole batches (see ``RecordDataset``).
        rank, world_size: override what ``torch.distributed`` reports.
        check: integrity on read (see :class:`~torchrecord.RecordDataset`).
    """

    STATE_KIND = "torchrecord.LeRobotStreamDataset"
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "items": "its items (the frames of the episodes chosen)",
        "episodes": "its episodes",
        "delta_timestamps": "its delta_timestamps",
        **ReaderDataset.SHARE_PLAN_KEYS,
    }

    def __init__(
        self,
        path: SetLike,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | None = None,
        image_transforms: Callable[[torch.Tensor], Any] | None = None,
        tolerance_s: float = 1e-4,
        batch_size: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int = 8192,
        block_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loader_batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        check: Check | None = None,
    ) -> None:
        self._init_reader(locals())
        self.items = LeRobotDataset(
            path,
            delta_timestamps=delta_timestamps,
            episodes=episodes,
            image_transforms=image_transforms,
            tolerance_s=tolerance_s,
            check=self.check,
        )
        self._set = self.items.frames.file.set_id  # read here: a worker needs no file for it

    def __repr__(self) -> str:
        return (
            f"LeRobotStreamDataset({self.items.path!r}, items={len(self.items)}, batch_size={self.batch_size}, "
            f"delta_timestamps={self.items.delta_timestamps!r}, epoch={self.epoch})"
        )

    # -- the contract ------------------------------------------------------------------
    def _set_id(self) -> str:
        return self._set

    def _where(self) -> str:
        return self.items.path

    def _per_rank(self) -> int:
        return _partition.samples_per_rank(len(self.items), self._distributed[1], self.drop_last)

    def _item_camera_bytes(self) -> int:
        """The camera bytes (uint8) one item reads: each camera's frame, times its window's length."""
        frames = self.items.frames
        deltas = self.items.delta_indices or {}
        return sum(
            int(np.prod(frames.shape(key))) * len(deltas.get(key, [0]))
            for key in self.items.robot.cameras
            if key in (*self.items.robot.video_keys, *self.items.robot.columns)
        )

    def _epoch_plan(self) -> SharePlan:
        count = len(self.items)
        per_item = max(1, self._item_camera_bytes())
        window = max(self.batch_size or 1, min(self.shuffle_buffer, WINDOW_BYTES // per_item))
        return self._share_plan(count, self.block_size or _partition.auto_block_size(count), window)

    def _plan_keys(self) -> dict[str, Any]:
        plan = self._epoch_plan()
        deltas = self.items.delta_timestamps
        chosen: dict[str, Any] = {"items": plan.count, "episodes": self.items.episodes}
        chosen["delta_timestamps"] = None if deltas is None else {k: deltas[k] for k in sorted(deltas)}
        return {**chosen, **self._share_plan_keys(plan)}

    def _batch_bytes(self) -> int | None:
        return (self.batch_size or 1) * 4 * max(1, self._item_camera_bytes())  # cameras as float32

    def reader_items(self, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The item indices reader ``worker`` of ``num_workers`` visits on this rank this epoch, window by window."""
        self._refresh_distributed()
        rank, world = self._distributed
        return list(self._epoch_plan().part(Reader(rank, world, worker, num_workers)).windows())

    # -- reading -------------------------------------------------------------------------
    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        assert isinstance(part, Share)
        first, skip = divmod(start.yielded * (self.batch_size or 1), part.window)  # items handed out already
        step = self.batch_size or SAMPLE_CHUNK
        items = self._items(self.items.path, None)
        pending: list[_Part] = []
        held = 0
        for index in part.windows(first):
            index, skip = index[skip:], 0
            if not len(index):  # resumed at the end of a window
                continue
            where, pads = self.items._queries(index)
            cameras = self.items.read_cameras(where)  # every frame of the window, once
            at = 0
            while at < len(index):
                n = min(step - held, len(index) - at)
                cut = slice(at, at + n)
                part_where = {key: w[cut] for key, w in where.items()}
                pending.append((part_where, {k: p[cut] for k, p in pads.items()}, cameras))
                held, at = held + n, at + n
                if held == step:
                    yield from self._emit(pending, items)
                    pending, held = [], 0
        if pending and not (self.drop_last and self.batch_size is not None):
            yield from self._emit(pending, items)

    def _emit(self, parts: list[_Part], items: Items) -> Iterator[Any]:
        """Consecutive items (window parts) as items: one batch, or the items one by one, through ``items``."""
        plain = self.transform is None and self.collate_fn is None and self.items.image_transforms is None
        # a plain batch of one part is built where it leaves a DataLoader worker (its slot): no copy there
        room = self._stack_room() if self.batch_size is not None and plain and len(parts) == 1 else None
        built = [self.items._columns(where, pads, cameras, room) for where, pads, cameras in parts]
        first = built[0][0]
        columns = first if len(built) == 1 else {k: torch.cat([c[k] for c, _ in built]) for k in first}
        names = [name for _, part_names in built for name in part_names]
        if self.batch_size is not None and plain:
            yield items.finish({**columns, "task": names})  # default_collate's batch, without the items
        elif self.batch_size is not None:
            yield items.batch(self.items.split(columns, names), False)
        else:
            yield from items.samples(self.items.split(columns, names), False)
