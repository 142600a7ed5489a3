"""robomimic's sequence windows: :class:`SequenceDataset` (map-style) and :class:`WindowDataset` (streaming).

Both read a set written by ``torchrecord.convert.from_robomimic`` through
``torchrecord._robomimic.windows`` (robomimic's windows, cache modes, items as arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from torchrecord._core.structure import flatten, unflatten
from torchrecord._order import partition as _partition
from torchrecord._order.plan import Part, Reader
from torchrecord._order.share import Share, SharePlan
from torchrecord._order.window_plan import WindowSpec
from torchrecord._read.base import ReaderDataset
from torchrecord._read.items import Items
from torchrecord._read.state import Start
from torchrecord._robomimic.windows import RoboWindows
from torchrecord._shards.open import SetLike
from torchrecord._store.checked import Check, parse_check
from torchrecord.errors import ArgumentError, IndexOutOfRangeError

__all__ = ["SequenceDataset", "WindowDataset"]

_UNSET: Any = object()
#: The ``kind`` of a WindowDataset state.
STATE_KIND = "torchrecord.WindowDataset"
#: A WindowDataset reads at most about this many bytes of frames from the file per shuffle buffer.
BUFFER_BYTES = 64 << 20


#: The values of ``frame_cache=``.
FrameCache = Literal["low_dim", "all"]


def _cache_mode(frame_cache: str | None, hdf5_cache_mode: Any) -> str | None:
    if hdf5_cache_mode is _UNSET:
        return frame_cache
    if frame_cache != "low_dim" and frame_cache != hdf5_cache_mode:
        raise ArgumentError(
            f"frame_cache={frame_cache!r} and hdf5_cache_mode={hdf5_cache_mode!r} disagree; give one of them"
        )
    return hdf5_cache_mode  # type: ignore[no-any-return]


def _check_unsupported(hdf5_normalize_obs: bool) -> None:
    if hdf5_normalize_obs:
        raise ArgumentError("hdf5_normalize_obs=True is not supported; normalise observations in the model")


class SequenceDataset(Dataset[dict[str, Any]]):
    """robomimic's ``SequenceDataset`` over a set written by ``torchrecord.convert.from_robomimic``.

    A drop-in replacement: the same parameters, the same ``len()`` and the same
    items (keys and their order, shapes, dtypes and values, NumPy arrays) as
    ``robomimic.utils.dataset.SequenceDataset`` (0.3.0) on the source HDF5 file.
    Each item is a window of ``frame_stack - 1 + seq_length`` steps of one demo;
    padding repeats the demo's first or last frame; ``get_pad_mask`` adds bool
    [T, 1] masks; ``goal_mode="last"`` adds the demo's last next_obs frame.
    Where robomimic fails at construction (or on the first item), this raises
    ValueError, naming the demo and the minimum length for a demo too short.

    Frame cache modes, over the memory-mapped file: ``"low_dim"`` copies the
    dataset keys (as float32, as robomimic does) and the low-dimensional obs keys
    (frames of rank 0 or 1) of the selected demos into one contiguous array per
    key, once per process; images are read from the file per item. ``"all"``
    holds every key that way (each frame once, not one copy per window).
    ``None`` reads everything from the file; dataset keys keep the file's dtype.

    Args:
        path: a converted set (a path, or a :class:`~torchrecord.RecordSet`).
        obs_keys, dataset_keys: keys to return (``dataset_keys`` as robomimic's:
            ``actions``, ``rewards``, ``dones``...).
        frame_stack, seq_length, pad_frame_stack, pad_seq_length, get_pad_mask,
            goal_mode, filter_by_attribute, load_next_obs: as in robomimic.
        frame_cache: which fields are held in memory: ``"low_dim"``, ``"all"`` or
            None; robomimic's ``hdf5_cache_mode`` is an alias.
        hdf5_use_swmr: ignored (accepted for drop-in use).
        hdf5_normalize_obs: only False is supported.
        check: integrity on read: ``"checksums"`` checks each record's CRC-32 as it
            is read, ``"structure"`` the file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`),
            ``"full"`` both.

    The dataset pickles without its cache (a spawn worker fills its own).
    """

    def __init__(
        self,
        path: SetLike,
        obs_keys: Sequence[str],
        dataset_keys: Sequence[str],
        frame_stack: int = 1,
        seq_length: int = 1,
        pad_frame_stack: bool = True,
        pad_seq_length: bool = True,
        get_pad_mask: bool = False,
        goal_mode: Literal["last"] | None = None,
        frame_cache: FrameCache | None = "low_dim",
        filter_by_attribute: str | None = None,
        load_next_obs: bool = True,
        *,
        hdf5_cache_mode: Any = _UNSET,
        hdf5_use_swmr: bool = True,
        hdf5_normalize_obs: bool = False,
        check: Check | None = None,
    ) -> None:
        _check_unsupported(hdf5_normalize_obs)
        check = parse_check(check)
        self.core = RoboWindows(
            path,
            obs_keys,
            dataset_keys,
            spec=WindowSpec(frame_stack, seq_length, pad_frame_stack, pad_seq_length),
            get_pad_mask=get_pad_mask,
            goal_mode=goal_mode,
            cache=_cache_mode(frame_cache, hdf5_cache_mode),
            filter_by_attribute=filter_by_attribute,
            load_next_obs=load_next_obs,
            check=check,
        )
        self.core.store.fill()

    @property
    def demos(self) -> list[str]:
        """The demos this dataset reads, in robomimic's order."""
        return [self.core.robo.demos[i] for i in self.core.selected]

    @property
    def frame_cache(self) -> str | None:
        """The frame cache mode in use: ``"low_dim"``, ``"all"`` or None."""
        return self.core.cache

    def __len__(self) -> int:
        return len(self.core)

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = int(index)
        if not 0 <= i < len(self.core):
            raise IndexOutOfRangeError(
                f"window {index} out of range for {self.core.path} with {len(self.core)} windows"
            )
        batch = self.core.items(np.array([i], dtype=np.int64))
        return _first(batch)

    def __repr__(self) -> str:
        spec = self.core.spec
        return (
            f"SequenceDataset({self.core.path!r}, demos={len(self.core.selected)}, windows={len(self)}, "
            f"frame_stack={spec.frame_stack}, seq_length={spec.seq_length}, frame_cache={self.frame_cache!r})"
        )


def _first(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: _first(v) if isinstance(v, dict) else v[0] for k, v in batch.items()}


class WindowDataset(ReaderDataset):
    """robomimic's windows as a stream for training loops: shuffled per epoch, sharded, batched in the worker.

    The same windows as :class:`SequenceDataset` with the same parameters (and
    the same values and dtypes), visited once per epoch in a seeded order: the
    windows are cut into blocks of consecutive windows, the blocks are visited in
    an order that changes every epoch and split over ranks and DataLoader workers
    as :class:`torchrecord.RecordDataset` splits records (``torchrecord._order.partition``);
    each reader then mixes a buffer of windows at a time. The frames a buffer
    needs (neighbouring windows share most of theirs) are read from the file once
    per buffer, and batches ``[B, T, ...]`` are gathered from them in the worker.

    Use ``DataLoader(ds, batch_size=None, num_workers=n)`` with ``batch_size``
    set here; call :meth:`set_epoch` before each epoch.

    Args:
        path, obs_keys, dataset_keys, frame_stack, seq_length, pad_frame_stack,
            pad_seq_length, get_pad_mask, goal_mode, frame_cache, filter_by_attribute,
            load_next_obs: as in :class:`SequenceDataset` (``hdf5_cache_mode`` is
            an alias of ``frame_cache``, as there).
        shuffle: a new window order every epoch (False: stored order).
        seed: the base seed of the order.
        batch_size: yield batches of this many windows (dicts of tensors
            [B, T, ...]); None yields single windows as tensors.
        drop_last: ranks cut the remainder instead of repeating windows from the
            epoch's start, and each rank drops its last short batch.
        rank, world_size: override what ``torch.distributed`` reports.
        transform: called on each window (a dict of tensors [T, ...]) after
            shuffling, before batching; batches of transformed windows are
            collated by what they hold (tensors of one shape stacked, numbers into
            a tensor, anything else a list), or by ``collate_fn``.
        batch_transform: called on each batch (batch mode).
        collate_fn: batch mode: turns the list of (transformed) windows of a batch
            into the batch, replacing the default collation.
        shuffle_buffer: windows mixed at a time per reader (capped so that their
            frames read from the file stay near 64 MiB; at least one batch).
        block_size: windows per block of the per-epoch block order (default:
            about windows/256, within [16, 4096]).
        loader_batch_size: per-sample mode: the ``batch_size`` of the DataLoader,
            so each worker's share is cut on whole batches and the loader yields
            exactly ``len(loader)`` batches (as for :class:`~torchrecord.RecordDataset`).
        check: integrity on read: ``"checksums"`` checks each record's CRC-32 as it
            is read, ``"structure"`` the file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`),
            ``"full"`` both.

    ``len()`` is the number of items (batches, or windows) each rank yields per epoch.

    Resume: :meth:`state_dict` / :meth:`load_state_dict` (torchdata's
    ``StatefulDataLoader`` calls them on each worker's copy) continue the epoch
    with the same ranks, workers and settings exactly where it stopped, reading
    only the buffers not yet finished.
    """

    def __init__(
        self,
        path: SetLike,
        obs_keys: Sequence[str],
        dataset_keys: Sequence[str],
        frame_stack: int = 1,
        seq_length: int = 1,
        pad_frame_stack: bool = True,
        pad_seq_length: bool = True,
        get_pad_mask: bool = False,
        goal_mode: Literal["last"] | None = None,
        frame_cache: FrameCache | None = "low_dim",
        filter_by_attribute: str | None = None,
        load_next_obs: bool = True,
        *,
        shuffle: bool = True,
        seed: int = 0,
        batch_size: int | None = None,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        shuffle_buffer: int = 8192,
        block_size: int | None = None,
        loader_batch_size: int | None = None,
        hdf5_cache_mode: Any = _UNSET,
        check: Check | None = None,
    ) -> None:
        self._init_reader(locals())
        self.core = RoboWindows(
            path,
            obs_keys,
            dataset_keys,
            spec=WindowSpec(frame_stack, seq_length, pad_frame_stack, pad_seq_length),
            get_pad_mask=get_pad_mask,
            goal_mode=goal_mode,
            cache=_cache_mode(frame_cache, hdf5_cache_mode),
            filter_by_attribute=filter_by_attribute,
            load_next_obs=load_next_obs,
            check=self.check,
        )
        self._set_id_cache: str | None = None
        self.core.store.fill()  # in this process: fork workers share it

    # -- configuration ------------------------------------------------------
    STATE_KIND = STATE_KIND
    RESUME_ADVICE = "resume with the same windows, settings and world size"
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "windows": "its windows",
        "window_spec": "its frame_stack, seq_length and padding",
        **ReaderDataset.SHARE_PLAN_KEYS,
    }

    def _set_id(self) -> str:
        if self._set_id_cache is None:
            self._set_id_cache = self.core.store.file.set_id
        return self._set_id_cache

    def _where(self) -> str:
        return self.core.path

    def _per_rank(self) -> int:
        return _partition.samples_per_rank(len(self.core), self._distributed[1], self.drop_last)

    @property
    def frame_cache(self) -> str | None:
        """The frame cache mode in use: ``"low_dim"``, ``"all"`` or None."""
        return self.core.cache

    @property
    def windows(self) -> int:
        """Windows in the whole set for these parameters (= ``len(SequenceDataset(...))``)."""
        return len(self.core)

    def __repr__(self) -> str:
        spec = self.core.spec
        return (
            f"WindowDataset({self.core.path!r}, windows={len(self.core)}, frame_stack={spec.frame_stack}, "
            f"seq_length={spec.seq_length}, batch_size={self.batch_size}, frame_cache={self.core.cache!r})"
        )

    # -- the plan -------------------------------------------------------------------
    def buffer_windows(self) -> int:
        """Windows mixed (and read) at a time by one reader."""
        frame = self._frame_bytes()
        cap = BUFFER_BYTES // frame if frame else self.shuffle_buffer
        return int(max(self.batch_size or 1, min(self.shuffle_buffer, cap)))

    def _epoch_plan(self) -> SharePlan:
        count = len(self.core)
        return self._share_plan(count, self.block_size or _partition.auto_block_size(count), self.buffer_windows())

    def _plan_keys(self) -> dict[str, Any]:
        plan, spec = self._epoch_plan(), self.core.spec
        shape = [spec.frame_stack, spec.seq_length, spec.pad_frame_stack, spec.pad_seq_length]
        return {"windows": plan.count, "window_spec": shape, **self._share_plan_keys(plan)}

    def reader_windows(self, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The window indices one reader visits this epoch, buffer by buffer, in order (a pure plan).

        ``worker`` of ``num_workers`` names the reader (DataLoader workers of this rank).
        """
        self._refresh_distributed()
        rank, world = self._distributed
        return list(self._epoch_plan().part(Reader(rank, world, worker, num_workers)).windows())

    def _frame_bytes(self) -> int:
        """The stored bytes of one frame of the fields read."""
        store = self.core.store
        return sum(
            int(np.prod(store.shape(n), dtype=np.int64)) * store.dtype(n).itemsize for n in self.core.file_fields
        )

    def _batch_bytes(self) -> int | None:
        frames = self.core.spec.frame_stack - 1 + self.core.spec.seq_length
        return (self.batch_size or 1) * frames * self._frame_bytes()

    # -- iteration --------------------------------------------------------------------
    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        assert isinstance(part, Share)
        first, skip = divmod(start.yielded * (self.batch_size or 1), part.window)  # windows handed out already
        step = self.batch_size or 256
        items = self._items(self.core.path, None)
        pending: list[dict[str, Any]] = []
        held = 0
        for index in part.windows(first):
            index, skip = index[skip:], 0
            leaves = self.core.leaves(index)
            block = self.core.block(leaves)
            at = 0
            while at < len(index):
                n = min(step - held, len(index) - at)
                part_leaves = [lf.select(slice(at, at + n)) for lf in leaves]
                pending.append(self.core.assemble(part_leaves, block))
                held += n
                at += n
                if held == step:
                    yield from self._emit(_join(pending), items)
                    pending, held = [], 0
        if pending and not (self.drop_last and self.batch_size is not None):
            yield from self._emit(_join(pending), items)

    def _emit(self, arrays: dict[str, Any], items: Items) -> Iterator[Any]:
        """Windows ``arrays`` (leaves [n, T, ...]) as items: one batch, or n windows, through ``items``."""
        tree, leaves = flatten(arrays)
        tensors = [torch.from_numpy(a) for a in leaves]
        count = len(tensors[0]) if tensors else 0
        windows: Iterator[Any] = (unflatten(tree, [t[i] for t in tensors]) for i in range(count))
        if self.batch_size is None:
            yield from items.samples(windows, False)
        elif self.transform is None and self.collate_fn is None:
            yield items.finish(unflatten(tree, tensors))  # the windows, already stacked
        else:
            yield items.batch(list(windows), False)

    @property
    def records_read(self) -> int:
        """Records this process read from the file (cache fills included)."""
        return self.core.store.records_read


def _join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    if len(parts) == 1:
        return parts[0]
    tree, _ = flatten(parts[0])
    columns = zip(*(flatten(p)[1] for p in parts))
    return unflatten(tree, [np.concatenate(c) for c in columns])  # type: ignore[no-any-return]
