"""StreamLoader: a StreamDataset's batches from DataLoader workers, several consecutive batches per handover.

A DataLoader worker pays a fixed cost for every item it hands to the main
process (the index and data queues, their feeder threads, pickling), on both
sides. ``StreamDataset`` batches of ``steps=1`` are small (B frames), so with a
plain ``DataLoader(ds, batch_size=None, num_workers=n)`` that cost eats most of
what the workers give (``results/streams.log``: without a transform, 0.73 s of
CPU for an epoch alone against 3.47 s in two workers plus 3.36 s in the main
process). A
:class:`StreamLoader` has worker w build bundles of ``bundle`` consecutive
batches, the bundles ``i`` with ``i % n == w``, hands each bundle over as one
item, and yields the batches one by one, in order: the same batches as the
dataset alone, for any number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from torchrecord._core.layout import FixedLayout
from torchrecord._core.structure import flatten, unflatten
from torchrecord._read.base import current_worker
from torchrecord._read.ipc import for_parent
from torchrecord._streams.dataset import StreamDataset
from torchrecord.errors import ArgumentError, ArgumentTypeError

__all__ = ["StreamLoader"]

#: a bundle holds about this many bytes of frames (under the by-value handover limit)
_BUNDLE_BYTES = 256 << 10
_MAX_BUNDLE = 64
_REFUSED = ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last", "in_order")


class StreamLoader:
    """Iterate a :class:`StreamDataset` with ``num_workers`` workers, handing over bundles of batches.

    Yields exactly the batches of ``StreamDataset`` iterated alone (and of
    ``DataLoader(ds, batch_size=None, num_workers=n)``), in order.

    Args:
        dataset: the stream dataset (its epoch is set with :meth:`set_epoch`).
        num_workers: DataLoader workers (0: build the batches in this process).
        bundle: consecutive batches per handover; default: about 256 KB of frames,
            at most 64 batches (1 for batches of 256 KB or more).
        **loader_kwargs: passed to the DataLoader (``multiprocessing_context``,
            ``persistent_workers``, ``pin_memory``, ``prefetch_factor``, ``timeout``,
            ``worker_init_fn``...). Batching and ordering options are refused.

    ``state_dict()`` is the position reached (the next batch to yield);
    ``load_state_dict`` takes it, or a :class:`StreamDataset` state, and the
    next iteration continues there with any number of workers.
    """

    def __init__(
        self, dataset: StreamDataset, *, num_workers: int = 0, bundle: int | None = None, **loader_kwargs: Any
    ) -> None:
        if not isinstance(dataset, StreamDataset):
            raise ArgumentTypeError(f"StreamLoader reads a StreamDataset, got {type(dataset).__name__}")
        if num_workers < 0:
            raise ArgumentError(f"num_workers must be >= 0, got {num_workers}")
        if bundle is not None and bundle < 1:
            raise ArgumentError(f"bundle must be >= 1, got {bundle}")
        refused = sorted(set(loader_kwargs) & set(_REFUSED))
        if refused:
            raise ArgumentError(f"StreamLoader builds whole batches in order; it does not take {', '.join(refused)}")
        self.dataset, self.num_workers = dataset, num_workers
        self.bundle = bundle if bundle is not None else _default_bundle(dataset)
        self._loader_kwargs = loader_kwargs
        self._bundles = _Bundles(dataset, self.bundle)
        self._loader: DataLoader[Any] | None = None  # kept across epochs with persistent workers
        self._start = 0  # the first batch of the next iteration (a resumed position)
        self._step = 0  # the next batch this iteration yields

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration plays (seen by persistent workers too)."""
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start, self._start = self._start, 0
        self._step = start
        len(self.dataset)  # reads the rank and world size here (workers see what the main process saw)
        if self.num_workers == 0:
            for t, batch in self.dataset._build_steps(range(start, len(self.dataset))):
                self._step = t + 1
                yield batch
            return
        self._bundles.start.fill_(start)
        loader = self._loader
        if loader is None:
            loader = DataLoader(self._bundles, batch_size=None, num_workers=self.num_workers, **self._loader_kwargs)
            if self._loader_kwargs.get("persistent_workers"):
                self._loader = loader
        for bundle in loader:
            for batch in _unpack(bundle):
                self._step += 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position reached: a StreamDataset state whose next step is the next batch to yield."""
        state = self.dataset.state_dict()
        state.update(next_step=self._step, worker=None, num_workers=None)
        return state

    def load_state_dict(self, state: Any) -> None:
        """Continue the next iteration from ``state`` (checked as :meth:`StreamDataset.load_state_dict` does)."""
        self.dataset.load_state_dict(state)
        resume, self.dataset._resume = self.dataset._resume, None
        self._start = 0 if resume is None else int(resume["step"])
        self._step = self._start


class _Bundles(IterableDataset[list[dict[str, Any]]]):
    """In worker w of n: the bundles i with i % n == w, each ``size`` consecutive batches from ``start``."""

    def __init__(self, dataset: StreamDataset, size: int) -> None:
        self.dataset, self.size = dataset, size
        self.start = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __iter__(self) -> Iterator[Any]:
        worker, workers = current_worker()
        start, size, total = int(self.start.item()), self.size, len(self.dataset)
        firsts = range(start + worker * size, total, workers * size)
        steps = [t for first in firsts for t in range(first, min(first + size, total))]
        bundle: list[dict[str, Any]] = []
        for t, batch in self.dataset._build_steps(steps):
            bundle.append(batch)
            if len(bundle) == size or t == total - 1:
                yield for_parent(_pack(bundle))
                bundle = []


def _default_bundle(dataset: StreamDataset) -> int:
    """About 256 KB of frames per bundle, at most 64 batches."""
    per_batch = dataset._batch_bytes(FixedLayout.of_file(dataset.file))
    return int(max(1, min(_MAX_BUNDLE, _BUNDLE_BYTES // per_batch)))


def _pack(bundle: list[dict[str, Any]]) -> Any:
    """A bundle as one stacked tensor [k, ...] per leaf when its batches share one structure and every
    leaf's shape and dtype (handed over and unstacked with a few calls, not a few per batch); else the list.
    """
    flat = [flatten(batch) for batch in bundle]
    tree = flat[0][0]
    columns = list(zip(*(leaves for _, leaves in flat)))
    if len(bundle) > 1 and all(t == tree for t, _ in flat) and all(_stackable(column) for column in columns):
        return {"stacked": [torch.stack(column) for column in columns], "tree": tree}
    return bundle


def _stackable(column: tuple[Any, ...]) -> bool:
    first = column[0]
    if not isinstance(first, torch.Tensor):
        return False
    return all(isinstance(x, torch.Tensor) and x.shape == first.shape and x.dtype == first.dtype for x in column)


def _unpack(bundle: Any) -> Iterator[dict[str, Any]]:
    """The batches of a bundle made by :func:`_pack`, in order."""
    if isinstance(bundle, list):
        yield from bundle
        return
    stacked, tree = bundle["stacked"], bundle["tree"]
    for i in range(len(stacked[0])):
        yield unflatten(tree, [leaf[i] for leaf in stacked])
