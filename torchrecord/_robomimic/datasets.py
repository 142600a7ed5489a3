"""robomimic's sequence windows: :class:`SequenceDataset` (map-style) and :class:`WindowDataset` (streaming).

Both read a set written by ``torchrecord.convert.from_robomimic`` through
``torchrecord._robomimic.windows`` (robomimic's windows, cache modes, items as arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from torchrecord._core.structure import flatten, unflatten
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._order.window_plan import WindowSpec
from torchrecord._read import resume as _resume
from torchrecord._robomimic.windows import RoboWindows
from torchrecord._shards.open import SetLike
from torchrecord.errors import ArgumentError, IndexOutOfRangeError, ResumeStateError

__all__ = ["SequenceDataset", "WindowDataset"]

_UNSET: Any = object()
#: The ``kind`` of a WindowDataset state.
STATE_KIND = "torchrecord.WindowDataset"
#: What must match for a state to resume: the plan of the epoch and the windows.
_PLAN_KEYS = (
    "windows",
    "window_spec",
    "seed",
    "shuffle",
    "batch_size",
    "drop_last",
    "block_size",
    "buffer",
    "world_size",
)
#: A WindowDataset reads at most about this many bytes of frames from the file per shuffle buffer.
BUFFER_BYTES = 64 << 20


def _cache_mode(cache: str | None, hdf5_cache_mode: Any) -> str | None:
    if hdf5_cache_mode is _UNSET:
        return cache
    if cache != "low_dim" and cache != hdf5_cache_mode:
        raise ArgumentError(f"cache={cache!r} and hdf5_cache_mode={hdf5_cache_mode!r} disagree; give one of them")
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

    Cache modes, over the memory-mapped file: ``"low_dim"`` copies the
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
        cache: ``"low_dim"``, ``"all"`` or None; ``hdf5_cache_mode`` is an alias.
        hdf5_use_swmr: ignored (accepted for drop-in use).
        hdf5_normalize_obs: only False is supported.
        verify: check each record's CRC-32 as it is read.
        check: ``"structure"``: check the file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`).

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
        goal_mode: str | None = None,
        cache: str | None = "low_dim",
        filter_by_attribute: str | None = None,
        load_next_obs: bool = True,
        *,
        hdf5_cache_mode: Any = _UNSET,
        hdf5_use_swmr: bool = True,
        hdf5_normalize_obs: bool = False,
        verify: bool = False,
        check: str | None = None,
    ) -> None:
        _check_unsupported(hdf5_normalize_obs)
        self.core = RoboWindows(
            path,
            obs_keys,
            dataset_keys,
            spec=WindowSpec(frame_stack, seq_length, pad_frame_stack, pad_seq_length),
            get_pad_mask=get_pad_mask,
            goal_mode=goal_mode,
            cache=_cache_mode(cache, hdf5_cache_mode),
            filter_by_attribute=filter_by_attribute,
            load_next_obs=load_next_obs,
            verify=verify,
            check=check,
        )
        self.core.store.fill()

    @property
    def demos(self) -> list[str]:
        """The demos this dataset reads, in robomimic's order."""
        return [self.core.robo.demos[i] for i in self.core.selected]

    @property
    def cache(self) -> str | None:
        """The cache mode in use: ``"low_dim"``, ``"all"`` or None."""
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
            f"frame_stack={spec.frame_stack}, seq_length={spec.seq_length}, cache={self.cache!r})"
        )


def _first(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: _first(v) if isinstance(v, dict) else v[0] for k, v in batch.items()}


class WindowDataset(IterableDataset[Any]):
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
            pad_seq_length, get_pad_mask, goal_mode, cache, filter_by_attribute,
            load_next_obs: as in :class:`SequenceDataset` (``hdf5_cache_mode`` is
            an alias of ``cache``, as there).
        shuffle: a new window order every epoch (False: stored order).
        seed: the base seed of the order.
        batch_size: yield batches of this many windows (dicts of tensors
            [B, T, ...]); None yields single windows as tensors.
        drop_last: ranks cut the remainder instead of repeating windows from the
            epoch's start, and each rank drops its last short batch.
        rank, world_size: override what ``torch.distributed`` reports.
        transform: called on each item yielded (a batch, or a window).
        shuffle_buffer: windows mixed at a time per reader (capped so that their
            frames read from the file stay near 64 MiB; at least one batch).
        block_size: windows per block of the per-epoch block order (default:
            about windows/256, within [16, 4096]).
        verify: check each record's CRC-32 as it is read.
        check: ``"structure"``: check the file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`).

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
        goal_mode: str | None = None,
        cache: str | None = "low_dim",
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
        shuffle_buffer: int = 8192,
        block_size: int | None = None,
        hdf5_cache_mode: Any = _UNSET,
        verify: bool = False,
        check: str | None = None,
    ) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise ArgumentError(f"batch_size must be >= 1 or None, got {batch_size!r}")
        if shuffle_buffer < 1:
            raise ArgumentError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
        if block_size is not None and block_size < 1:
            raise ArgumentError(f"block_size must be >= 1, got {block_size}")
        if seed < 0:
            raise ArgumentError(f"seed must be >= 0, got {seed}")
        if (rank is None) != (world_size is None):
            raise ArgumentError("give both rank and world_size, or neither")
        if world_size is not None and not 0 <= rank < world_size:  # type: ignore[operator]
            raise ArgumentError(f"rank {rank} is not in [0, {world_size})")
        self.core = RoboWindows(
            path,
            obs_keys,
            dataset_keys,
            spec=WindowSpec(frame_stack, seq_length, pad_frame_stack, pad_seq_length),
            get_pad_mask=get_pad_mask,
            goal_mode=goal_mode,
            cache=_cache_mode(cache, hdf5_cache_mode),
            filter_by_attribute=filter_by_attribute,
            load_next_obs=load_next_obs,
            verify=verify,
            check=check,
        )
        self.shuffle, self.seed, self.batch_size, self.drop_last = shuffle, seed, batch_size, drop_last
        self.transform, self.shuffle_buffer, self.block_size = transform, shuffle_buffer, block_size
        self._explicit = (rank, world_size) if rank is not None else None
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._resume: dict[tuple[int, int], int] | None = None  # (worker, num_workers) -> items yielded
        self._yielded = 0
        self.core.store.fill()  # in this process: fork workers share it

    # -- configuration ------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (reaches persistent workers)."""
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (shared with persistent workers)."""
        return int(self._epoch.item())

    @property
    def windows(self) -> int:
        """Windows in the whole set for these parameters (= ``len(SequenceDataset(...))``)."""
        return len(self.core)

    def _world(self) -> tuple[int, int]:
        if self._explicit is not None:
            return self._explicit  # type: ignore[return-value]
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def __len__(self) -> int:
        per_rank = _partition.samples_per_rank(len(self.core), self._world()[1], self.drop_last)
        if self.batch_size is None:
            return per_rank
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __repr__(self) -> str:
        spec = self.core.spec
        return (
            f"WindowDataset({self.core.path!r}, windows={len(self.core)}, frame_stack={spec.frame_stack}, "
            f"seq_length={spec.seq_length}, batch_size={self.batch_size}, cache={self.core.cache!r})"
        )

    # -- the plan -------------------------------------------------------------------
    def buffer_windows(self) -> int:
        """Windows mixed (and read) at a time by one reader."""
        store = self.core.store
        frame = sum(
            int(np.prod(store.shape(n), dtype=np.int64)) * store.dtype(n).itemsize for n in self.core.file_fields
        )
        cap = BUFFER_BYTES // frame if frame else self.shuffle_buffer
        return int(max(self.batch_size or 1, min(self.shuffle_buffer, cap)))

    def reader_windows(self, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The window indices one reader visits this epoch, buffer by buffer, in order (a pure plan).

        ``worker`` of ``num_workers`` names the reader (DataLoader workers of this rank).
        """
        rank, world = self._world()
        count = len(self.core)
        block = self.block_size or _partition.auto_block_size(count)
        runs = _partition.reader_runs(
            count,
            block_size=block,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            rank=rank,
            world_size=world,
            worker=worker,
            num_workers=num_workers,
            drop_last=self.drop_last,
            unit=self.batch_size,
        )
        total = sum(b - a for a, b in runs)
        size = self.buffer_windows()
        out = []
        for j in range(-(-total // size)):
            part = _order.slice_runs(runs, j * size, min(total, (j + 1) * size))
            index = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in part])
            if self.shuffle:
                order = _order.window_order(
                    len(index), seed=self.seed, epoch=self.epoch, rank=rank, worker=worker, window=j
                )
                index = index[order]
            out.append(index)
        return out

    # -- iteration --------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        resume, self._resume = self._resume, None
        self._yielded = (resume or {}).get((worker, workers), 0)
        skip = self._yielded * (self.batch_size or 1)  # windows already handed out this epoch
        step = self.batch_size or 256
        pending: list[dict[str, Any]] = []
        held = 0
        for index in self.reader_windows(worker, workers):
            if skip >= len(index):
                skip -= len(index)
                continue
            index, skip = index[skip:], 0
            leaves = self.core.leaves(index)
            block = self.core.block(leaves)
            at = 0
            while at < len(index):
                n = min(step - held, len(index) - at)
                part = [lf.select(slice(at, at + n)) for lf in leaves]
                pending.append(self.core.assemble(part, block))
                held += n
                at += n
                if held == step:
                    yield from self._emit(_join(pending))
                    pending, held = [], 0
        if pending and not (self.drop_last and self.batch_size is not None):
            yield from self._emit(_join(pending))

    def _emit(self, arrays: dict[str, Any]) -> Iterator[Any]:
        tree, leaves = flatten(arrays)
        tensors = [torch.from_numpy(a) for a in leaves]
        if self.batch_size is not None:
            items: Iterator[Any] = iter([unflatten(tree, tensors)])
        else:
            items = (unflatten(tree, [t[i] for t in tensors]) for i in range(len(tensors[0]) if tensors else 0))
        for item in items:
            self._yielded += 1
            yield self.transform(item) if self.transform is not None else item

    # -- resume -------------------------------------------------------------------------
    def _plan_state(self) -> dict[str, Any]:
        spec = self.core.spec
        return {
            "windows": len(self.core),
            "window_spec": [spec.frame_stack, spec.seq_length, spec.pad_frame_stack, spec.pad_seq_length],
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "block_size": self.block_size,
            "buffer": self.buffer_windows(),
            "world_size": self._world()[1],
        }

    def state_dict(self) -> dict[str, Any]:
        """This reader's position: items yielded this epoch, who it is, and the plan (small, plain values)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        state: dict[str, Any] = {"kind": STATE_KIND, "version": _resume.STATE_VERSION}
        state.update(set_id=self.core.store.file.set_id, epoch=self.epoch, rank=self._world()[0])
        state.update(worker=worker, num_workers=workers, yielded=self._yielded)
        state.update(self._plan_state())
        return state

    def load_state_dict(self, state: Any) -> None:
        """Resume the epoch from a state (or any nesting of the states of several workers).

        The next iteration of each worker continues after the items its state
        says it yielded. Call :meth:`set_epoch` with the saved epoch first.
        Raises ValueError for another set, a later epoch, a newer state version,
        or other settings, ranks or windows (the order would differ).
        """
        found = list(_resume.find_states(state, (STATE_KIND,)))
        if not found:
            raise ResumeStateError(f"{self.core.path}: no WindowDataset state found in what was given")
        set_id = self.core.store.file.set_id
        mine = self._plan_state()
        resume: dict[tuple[int, int], int] = {}
        for s in found:
            kept = _resume.accept(s, set_id=set_id, epoch=self.epoch, path=self.core.path, kinds=(STATE_KIND,))
            if kept is None:
                continue
            for key in _PLAN_KEYS:
                if kept.get(key) != mine[key]:
                    raise ResumeStateError(
                        f"{self.core.path}: the state was saved with {key}={kept.get(key)!r}, this dataset has "
                        f"{mine[key]!r}; resume with the same windows, settings and world size"
                    )
            if kept.get("rank") == self._world()[0]:
                resume[(int(kept["worker"]), int(kept["num_workers"]))] = int(kept["yielded"])
        self._resume = resume or None

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
