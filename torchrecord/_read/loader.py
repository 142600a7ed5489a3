"""RecordLoader: the one loader of every reader dataset, whose state is the whole run's position.

Trainers that save the loader's ``state_dict`` of one rank only (PyTorch Lightning under DDP
writes rank 0's checkpoint and loads that one file on every rank) need a state that resumes
every rank. ``RecordLoader.state_dict`` gathers every rank's position over ``torch.distributed``
(a collective: every rank calls it) and merges them with :func:`loader_position`; any rank
resumes its own share of that one position, on the same world or on another. It needs only
``torch.distributed``, and reads any :class:`~torchrecord._read.base.ReaderDataset`.

With workers, in batch mode, each worker hands several consecutive batches over as one DataLoader item
(a bundle, ``torchrecord._read.ipc.bundled``) and the loader yields them one by one: the DataLoader's
fixed cost per item is paid once per bundle, in the worker and in the main process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch._C._autograd import _profiler_enabled
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from torchrecord._read.base import ReaderDataset
from torchrecord._read.handout import as_tensors
from torchrecord._read.ipc import BY_VALUE_LIMIT, Bundle, for_parent, keep_bundles, worker_id
from torchrecord._read.state import MAX_EPOCH, loader_position
from torchrecord.errors import ArgumentError, ArgumentTypeError, ResumeStateError

__all__ = ["RecordLoader"]

#: DataLoader options the loader sets itself, or that would break the count it derives the position from.
_REFUSED = ("shuffle", "sampler", "batch_sampler", "drop_last")


#: a default bundle holds about this many bytes of batches that cross in slots, at most _MAX_BUNDLE of them
#: (``python -m benchmarks.run --loaders torchrecord-batch torchrecord-loader``); batches small enough to
#: cross by value (up to ``BY_VALUE_LIMIT``, 64 KiB) come _MAX_SMALL_BUNDLE a bundle, at most 16 MiB, which
#: crosses together in one slot.
#: Small batches once had bundles of 256 KiB (at most 64): with 2 workers, StreamDataset's 41 KB batches then
#: read at 0.49-0.61x of 0 workers and 18 KB batches of tiny vectors at 0.37-0.55x; with 196-256 a bundle,
#: 0.79-0.99x and 0.56-0.83x (loaders of each size alternating in one process; see the changelog)
#: At most 8 slot batches a bundle until the gather into a worker's slot copied each sample once (torch): small
#: images packed (786 KB batches, 21 a bundle under 16 MiB), 2 persistent workers, 15 epochs: 8 a bundle
#: 42.3-44.2 ms an epoch, 16 38.9-39.4 ms, 32 (the 16 MiB rule alone) 37.6-38.4 ms; a bundle's handover (its
#: batches' stacking checks, the queue) costs about 0.3 ms, a per-batch cost once bundles are short
_BUNDLE_BYTES = 16 << 20
_MAX_BUNDLE = 32
_MAX_SMALL_BUNDLE = 256
#: a reader with a transform, batch_transform or collate_fn may make batches of any size from small stored
#: ones: its small batches keep the old rule, about _VALUE_BYTES of stored bytes, at most _MAX_VALUE_BUNDLE
#: (256 batches each grown to megabytes would hold gigabytes in flight)
_VALUE_BYTES = 256 << 10
_MAX_VALUE_BUNDLE = 64


def auto_bundle(dataset: ReaderDataset, loader_batch_size: int | None = None) -> int:
    """The default batches per handover, the one rule of every reader: about 16 MiB of batches, at most 32 that
    cross in slots or 256 small enough to cross by value (with a transform, batch_transform or collate_fn,
    which may change a batch's size: about 256 KiB of them, at most 64); 1 when the reader cannot tell a
    batch's size.

    ``loader_batch_size``: per-sample mode, the samples of a loader batch (batch mode: the dataset's batch).
    """
    item_bytes = dataset._batch_bytes()
    if item_bytes is None:
        return 1
    per_batch = 1 if dataset.batch_size is not None else (loader_batch_size or 1)
    batch_bytes = max(1, per_batch * item_bytes)
    if batch_bytes <= BY_VALUE_LIMIT:
        if any(f is not None for f in (dataset.transform, dataset.batch_transform, dataset.collate_fn)):
            return max(1, min(_MAX_VALUE_BUNDLE, -(-_VALUE_BYTES // batch_bytes)))
        return _MAX_SMALL_BUNDLE
    return max(1, min(_MAX_BUNDLE, -(-_BUNDLE_BYTES // batch_bytes)))


def _default_collate() -> Callable[[list[Any]], Any]:
    from torchrecord._read.collate import collate

    return collate


def _as_read(item: Any) -> Any:
    """The DataLoader's collate_fn where items come ready: fused per-sample batches (whole batches of tensors
    already), and batch mode's batches and bundles (each batch converted where it was made)."""
    return item


class _CollateBundle:
    """A DataLoader collate_fn for per-sample mode with bundles: the samples of several loader batches in, each
    batch of ``size`` samples collated by ``collate`` and made ready to leave the worker, out as one Bundle."""

    def __init__(self, collate: Callable[[list[Any]], Any], size: int) -> None:
        self.collate, self.size = collate, size
        # torchrecord.collate hands its batch over itself (stacked into its slot); a user's collate_fn does not
        self.hands_over = collate is _default_collate()

    def __call__(self, samples: list[Any]) -> Bundle:
        size, collate = self.size, self.collate
        keep_bundles(-(-len(samples) // size))  # a bundle's slots come back together: kept, not made anew
        parts = [samples[i : i + size] for i in range(0, len(samples), size)]
        batches = [collate(part) for part in parts] if self.hands_over else [for_parent(collate(p)) for p in parts]
        return Bundle(batches, worker_id())


class _Count:
    """A count the loader keeps outside its own attributes: ``DataLoader.__setattr__`` checks every attribute
    set (about 1 us), and the loader counts every batch it hands out (a batch of tiny samples takes 25 us)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class _WithoutSpan(_BaseDataLoaderIter):
    """torch's iterator without its per-item profiler span, unless a profiler is on.

    ``_BaseDataLoaderIter.__next__`` opens a ``record_function`` span for every item: about 15 us a batch
    here, as much as a whole batch of tiny samples takes to read (with workers, an item is a bundle). The
    rest is torch's ``__next__``; its warning about an IterableDataset yielding more than ``len(loader)`` is
    left out: a ``RecordLoader``'s length is its dataset's own count.
    """

    def __next__(self) -> Any:
        if _profiler_enabled():
            return super().__next__()
        if self._sampler_iter is None:
            self._reset()  # type: ignore[call-arg]
        data: Any = self._next_data()
        self._num_yielded += 1
        return data


class _SingleProcessIter(_WithoutSpan, _SingleProcessDataLoaderIter):
    """torch's iterator at 0 workers, without the per-item span."""


class _MultiProcessIter(_WithoutSpan, _MultiProcessingDataLoaderIter):
    """torch's iterator with workers, without the per-item span."""


class _BundlingInit:
    """A worker_init_fn: the worker's copy of the dataset hands over ``size`` batches at a time, then the user's."""

    def __init__(self, size: int, then: Callable[[int], Any] | None) -> None:
        self.size, self.then = size, then

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        if info is not None:
            info.dataset._bundle = self.size  # type: ignore[attr-defined]
        if self.then is not None:
            self.then(worker_id)


class _LoaderShape:
    """The loader a per-sample RecordLoader with bundles stands for (its DataLoader fetches several batches at
    once): ``len(dataset)`` called from its ``__len__`` checks this one's batch size."""

    def __init__(self, batch_size: int, num_workers: int) -> None:
        self.batch_size, self.num_workers, self.drop_last = batch_size, num_workers, False
        self.dataset: ReaderDataset | None = None

    def batches_of(self, dataset: ReaderDataset) -> int:
        self.dataset = dataset
        return -(-self.__len__() // self.batch_size)

    def __len__(self) -> int:
        assert self.dataset is not None
        return len(self.dataset)  # the dataset sees this loader asking, and warns about its count if it must


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's position, in rank order (a collective under torch.distributed; ``[mine]`` without it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


class RecordLoader(DataLoader[Any]):
    """The DataLoader of every torchrecord reader, whose ``state_dict`` resumes every rank on any world.

    It reads any streaming dataset of torchrecord (``RecordDataset``, ``MixedDataset``,
    ``StreamDataset``, ``WindowDataset``...) and yields the same batches, in the same
    order, as ``DataLoader(dataset, batch_size=None, num_workers=n)`` (in per-sample
    mode, as ``DataLoader(dataset, batch_size=B, ...)``). It counts the batches it
    hands out in the epoch. ``state_dict()`` turns the count into this rank's position
    (the dataset's ``position_after``), gathers the positions of every rank with
    ``torch.distributed.all_gather_object`` and merges them with
    :func:`torchrecord.loader_position`: the state is the same on every rank, so a
    trainer that saves rank 0's loader state only (PyTorch Lightning under DDP) saves
    the whole run's position. ``load_state_dict`` sets the dataset's epoch to the saved
    one and loads the position; the next iteration of each rank plays its own part of
    the rest of the epoch: in the same order on the same ranks and workers, and every
    item not yet handed out exactly once on any other number of ranks or workers.

    Under ``torch.distributed``, ``state_dict`` is a collective: call it on every rank at the
    same step (Lightning does). Lightning needs nothing else: it saves and restores a train
    loader that has ``state_dict`` and ``load_state_dict``.

    Args:
        dataset: the reader dataset. In batch mode (``batch_size`` on the dataset) the
            loader yields its batches as they are; in per-sample mode give the loader's
            ``batch_size`` here (1 when left out: single samples).
        num_workers: DataLoader workers per rank.
        bundle: with workers: consecutive batches a worker hands over as one
            DataLoader item (yielded one by one, in the same order as without
            bundles, so positions do not depend on it). Default: one rule for every
            reader, about 16 MiB of batches: at most 32 that cross in shared-memory
            slots, at most 256 small enough to cross by value (together, in one
            slot; with a transform, batch_transform or collate_fn about 256 KiB of
            them, at most 64); 1 where the reader cannot tell a batch's size. 1
            turns bundles off. In
            per-sample mode each worker fetches the samples of ``bundle`` batches at
            once and collates each batch with ``collate_fn`` (default
            ``torchrecord.collate``).
        batch_size: per-sample mode only: samples per batch of the DataLoader (the
            dataset's ``loader_batch_size`` when it has one). ``collate_fn`` (default
            ``torchrecord.collate``, which gives ``default_collate``'s batches) is given
            them.
        **loader_kwargs: passed to the DataLoader (``collate_fn``, ``pin_memory``,
            ``multiprocessing_context``, ``prefetch_factor``, ``timeout``,
            ``worker_init_fn``, ``persistent_workers``...); ``shuffle``, ``sampler``,
            ``batch_sampler`` and ``drop_last`` are refused (the dataset orders and cuts
            the epoch). In batch mode a ``collate_fn`` is applied to each of the
            dataset's batches in the process that makes it (a worker, before its
            batches are bundled), as ``DataLoader(batch_size=None)`` applies it; by
            default :func:`~torchrecord._read.handout.as_tensors`: NumPy arrays become
            tensors, and a batch keeps its structure (a tuple stays a tuple, where
            ``default_convert`` makes it a list).

    Raises:
        ArgumentTypeError: ``dataset`` is not one of torchrecord's reader datasets.
        ArgumentError: a refused option, ``batch_size`` in batch mode, a negative
            ``num_workers``, ``in_order=False``, or a ``bundle`` that is not an integer
            >= 1.
    """

    def __init__(
        self,
        dataset: ReaderDataset,
        *,
        num_workers: int = 0,
        batch_size: int | None = None,
        bundle: int | None = None,
        **loader_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ReaderDataset):
            raise ArgumentTypeError(
                f"RecordLoader reads torchrecord's reader datasets (RecordDataset, MixedDataset, StreamDataset, "
                f"WindowDataset...), got {type(dataset).__name__}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ArgumentError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        refused = sorted(set(loader_kwargs) & set(_REFUSED))
        if refused:
            raise ArgumentError(
                f"RecordLoader: the dataset orders and cuts the epoch; it does not take {', '.join(refused)}"
            )
        self._per_batch = self._per_batch_of(dataset, batch_size)
        # batch mode: each batch goes through the loader's collate_fn (default: as_tensors, which keeps tuples
        # tuples) where it is made, in the worker before it is bundled or in this process; the DataLoader's own
        # collate_fn then passes items (bundles among them) through
        self._convert: Callable[[Any], Any] | None = None
        if self._per_batch is None:
            self._convert = loader_kwargs.get("collate_fn") or as_tensors
            loader_kwargs["collate_fn"] = _as_read
        if self._per_batch is not None:
            dataset._sample_chunk = self._per_batch  # read a loader batch at a time: collated without a copy
        if loader_kwargs.get("in_order", True) is not True:
            raise ArgumentError(
                "RecordLoader hands batches out in the dataset's order (its state and bundles depend on it): "
                "in_order=False is refused"
            )
        if bundle is not None and (isinstance(bundle, bool) or not isinstance(bundle, int) or bundle < 1):
            raise ArgumentError(f"bundle must be an integer >= 1, got {bundle!r}")
        if num_workers == 0:
            bundle = 1
        elif bundle is None:
            bundle = auto_bundle(dataset, self._per_batch)
        self.bundle: int = bundle
        # per-sample mode with the default collation, of a reader that can: each loader batch is read whole
        # (what collating its samples gives) instead of sample by sample (ReaderDataset._fused)
        fusing = self._per_batch is not None and loader_kwargs.get("collate_fn") is None and dataset._fusable()
        self._fuse: int | None = self._per_batch if fusing else None
        batch_size = None if fusing else self._per_batch
        if fusing:
            loader_kwargs["collate_fn"] = _as_read  # its batches are tensors already: no default_convert walk
        if self._per_batch is not None and not fusing and loader_kwargs.get("collate_fn") is None:
            # per-sample mode collates with torchrecord.collate unless told otherwise: default_collate's batches,
            # handed over through torchrecord's slots in a worker, and one chunk's column without a copy at 0
            loader_kwargs["collate_fn"] = _default_collate()
        if bundle > 1 and self._per_batch is not None and not fusing:
            # per-sample mode: each worker fetches `bundle` loader batches of samples at once and collates them
            # one by one, handed over as one bundle
            loader_kwargs["collate_fn"] = _CollateBundle(loader_kwargs["collate_fn"], self._per_batch)
            batch_size = self._per_batch * bundle
        elif bundle > 1:
            loader_kwargs["worker_init_fn"] = _BundlingInit(bundle, loader_kwargs.get("worker_init_fn"))
        super().__init__(dataset, batch_size=batch_size, num_workers=num_workers, **loader_kwargs)
        self._epoch = dataset.epoch  # the epoch `_handed` counts in
        self._handed = _Count()  # batches handed out in `_epoch`
        self._exhausted = False  # the iteration of `_epoch` ran to its end
        self._resume_at = 0  # batches of the epoch the loaded position had handed out
        self._elastic: dict[str, Any] | None = None  # a state of another world loaded, while nothing was handed out

    @staticmethod
    def _per_batch_of(dataset: ReaderDataset, batch_size: Any) -> int | None:
        """The DataLoader's batch size in per-sample mode (None in batch mode), checked."""
        if dataset.batch_size is not None:
            if batch_size is not None:
                raise ArgumentError(
                    f"{dataset._where()}: RecordLoader(batch_size={batch_size}) is for per-sample mode; this "
                    f"dataset yields whole batches (batch_size={dataset.batch_size}): leave batch_size out"
                )
            return None
        if batch_size is None:
            batch_size = dataset.loader_batch_size if dataset.loader_batch_size is not None else 1
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return batch_size

    def __len__(self) -> int:
        """Batches per epoch on this rank, as a plain DataLoader of the same batch size yields them."""
        if self._per_batch is None or (self.bundle == 1 and self._fuse is None):
            return super().__len__()
        return _LoaderShape(self._per_batch, self.num_workers).batches_of(self.reader_dataset)

    @property
    def reader_dataset(self) -> ReaderDataset:
        """The dataset read (typed: ``DataLoader.dataset`` is any dataset)."""
        dataset = self.dataset
        assert isinstance(dataset, ReaderDataset)
        return dataset

    record_dataset = reader_dataset

    @property
    def epoch(self) -> int:
        """The dataset's epoch (the one the next iteration plays)."""
        return self.reader_dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration plays (the dataset's ``set_epoch``; persistent workers see it)."""
        self.reader_dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.reader_dataset._refresh_distributed()  # the rank and world size the workers take with them
        self._epoch, self._exhausted = self.reader_dataset.epoch, False
        handed = self._handed
        handed.n, self._resume_at = self._resume_at, 0
        round_: list[Bundle] = []  # the bundles of one round, one per worker with batches left
        self._elastic = None
        for item in self._started():
            if type(item) is not Bundle:
                handed.n += 1
                yield item
                continue
            if round_ and item.worker <= round_[-1].worker:  # the turn came back: a new round
                yield from self._interleaved(round_)
                round_ = []
            round_.append(item)
        yield from self._interleaved(round_)
        self._exhausted = True

    def _started(self) -> Iterator[Any]:
        """The DataLoader's iterator, started with the dataset told to read whole batches when fusing: the
        dataset's iteration (here at 0 workers) and the workers' copies (pickled or forked as they start) see it;
        the dataset itself, iterated any other way, does not."""
        dataset = self.reader_dataset
        dataset._fused, dataset._convert = self._fuse, self._convert
        try:
            return super().__iter__()
        finally:
            dataset._fused = dataset._convert = None

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        self.check_worker_number_rationality()  # what DataLoader._get_iterator does first
        return _MultiProcessIter(self)

    def _interleaved(self, round_: list[Bundle]) -> Iterator[Any]:
        """The batches of one round of bundles in the order a DataLoader without bundles yields them: the first
        batch of each worker in turn, then the second... (so the order, and positions, do not depend on bundles)."""
        columns = [bundle.batches for bundle in round_]
        round_.clear()
        handed = self._handed
        for i in range(max((len(c) for c in columns), default=0)):
            for column in columns:
                if i < len(column):
                    batch, column[i] = column[i], None  # held here no longer than the user holds it
                    handed.n += 1
                    yield batch

    def _mine(self) -> tuple[int, dict[str, Any]]:
        """This rank's batches handed out and position in the dataset's current epoch."""
        dataset = self.reader_dataset
        if self._elastic is not None and self._epoch == dataset.epoch:  # nothing handed out since: as it was
            return int(self._elastic["batches"]), self._elastic["position"]
        if self._epoch != dataset.epoch:  # a new epoch, not iterated yet
            batches = 0
        elif self._exhausted:
            batches = len(self)
        else:
            batches = self._handed.n
        if self.num_workers == 0 and dataset._count_problem() is not None:
            # a reader whose progress is more than a count (MixedDataset, policy="ready"): its own state
            return batches, loader_position([dataset.state_dict()])
        return batches, dataset.position_after(batches, **self._position_kwargs())

    def state_dict(self) -> dict[str, Any]:
        """The whole run's position: every rank's, merged (a collective under ``torch.distributed``).

        Returns:
            ``{"batches": n, "position": p}``: the batches this loader handed out in the
            epoch and the merged :func:`torchrecord.loader_position` of every rank (plain
            values). The position alone also resumes the dataset on any world size and
            number of workers (its ``load_state_dict``).
        """
        batches, mine = self._mine()
        position = loader_position(_gather(mine))  # every rank takes part, whatever it holds
        return {"batches": batches, "position": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from what :meth:`state_dict` returned: the next iteration plays the rest of its epoch.

        Sets the dataset's epoch to the position's and loads the position into the dataset
        (it reaches the workers of the next iteration). On the same ranks and workers each
        rank gets exactly the rest of its part, in order; on others, every item not yet
        handed out comes once over the new ranks and workers (elastic resume), and the
        count starts again from that point.

        Raises:
            ResumeStateError: not a RecordLoader state, or a position this dataset refuses
                (another set, other order settings, any field that does not fit).
        """
        dataset = self.reader_dataset
        where = dataset._where()
        if not isinstance(state, dict) or set(state) != {"batches", "position"}:
            keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise ResumeStateError(
                f"{where}: not a RecordLoader state (expected the keys 'batches' and 'position', got {keys})"
            )
        batches, position = state["batches"], state["position"]
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise ResumeStateError(f"{where}: RecordLoader state: 'batches' must be an integer >= 0, got {batches!r}")
        epoch = position.get("epoch") if isinstance(position, dict) else None
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise ResumeStateError(
                f"{where}: RecordLoader state: the position's epoch must be an integer from 0 to {MAX_EPOCH}, got "
                f"{epoch!r}"
            )
        dataset.set_epoch(epoch)  # the epoch first: a position of a later epoch is refused
        dataset.load_state_dict(position)  # checks every field; reaches the workers of the next iteration
        loaded = dataset._loaded
        same = loaded is not None and (loaded["world_size"], loaded["num_workers"]) == (
            dataset._distributed[1],
            max(1, self.num_workers),
        )
        self._epoch, self._exhausted = epoch, False
        self._handed.n = self._resume_at = batches if same else 0
        self._elastic = None if same else {"batches": batches, "position": position}

    def _position_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_workers": self.num_workers}
        if self._per_batch is not None:
            kwargs["loader_batch_size"] = self._per_batch
        return kwargs
