"""Whole record sets in memory, and batches drawn from tensors without a DataLoader.

When the data fits in memory (host or GPU) and the model is small, a
``DataLoader(TensorDataset)`` spends most of its time indexing and collating one
sample at a time. :func:`load` reads a record set once into ``[N, ...]`` tensors;
:class:`BatchIter` then draws shuffled batches with one ``index_select`` per field
per batch, and :class:`GroupBatchIter` draws batches of whole groups (queries and
their candidates, for list-wise ranking losses). Both run in the calling process,
on the tensors' device, with no worker processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._memory.columns import Columns, SampleList, epoch_rng
from torchrecord._memory.load import Subset, load_columns
from torchrecord._order.group_batches import GroupPlan, check_offsets, offsets_from_ids, plan_epoch
from torchrecord._read import rules as _resume
from torchrecord._shards.open import SetLike
from torchrecord.errors import ArgumentError, ResumeStateError

__all__ = ["BatchIter", "GroupBatchIter", "SampleList", "load"]

#: Streams of :func:`torchrecord._memory.columns.epoch_rng`, one per kind of shuffle.
_SAMPLE_STREAM = 0x73616D70
_GROUP_STREAM = 0x67727570


def load(
    path: SetLike,
    *,
    fields: str | Sequence[str] | None = None,
    subset: Subset | None = None,
    device: str | torch.device = "cpu",
) -> Any:
    """Read a whole record set (or some fields, or some samples) into memory in one sequential pass.

    The result has the structure of one sample, with every field as a column:
    fixed-shape numeric fields (tensors, arrays, ints, floats, bools) as one
    tensor ``[N, *shape]`` of the field's dtype; strings, bytes and fields whose
    shape varies as a :class:`SampleList` of N items of the kind they were written
    as. Hand it to :class:`BatchIter` or :class:`GroupBatchIter`; for a grouped set,
    ``open_set(path).groups`` gives the offsets for ``GroupBatchIter``.

    Args:
        path: a record set written by :func:`torchrecord.write_record`, a sharded
            set (its folder, manifest or URL), or a :class:`~torchrecord.RecordSet`
            (e.g. a remote set opened with ``open_set(url, cache_dir=...)``).
        fields: names of the fields to keep (``open_set(path).schema.names``:
            ``"0"``, ``"image"``, ``"meta.id"``); the others are left out of the
            result (containers left empty disappear). ``None`` keeps all.
        subset: the samples to keep, in this order: a ``range``, a ``slice``
            (clipped as Python slices are), an integer index array (negative
            indices count from the end; repeats allowed) or a boolean mask of
            length N. ``None`` keeps all.
        device: where the tensors are put (``"cuda"`` for data that fits on the GPU).

    Returns:
        The columns, in the structure of a sample.

    Raises:
        ValueError: an unknown field, an empty choice, an index out of range, or
            an empty record set (it has no schema to load).
        torchrecord.errors.FormatError: the file is not a readable record set.

    Example:
        >>> images, labels = load("train.tr", device="cuda")          # doctest: +SKIP
        >>> for x, y in BatchIter((images, labels), batch_size=256):  # doctest: +SKIP
        ...     ...
    """
    return load_columns(path, fields=fields, subset=subset, device=device)


def _check_count(name: str, value: int | None, *, minimum: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


#: The version of BatchIter and GroupBatchIter states this torchrecord writes and reads.
STATE_VERSION = 1


def _accept(state: Any, kind: str, mine: Mapping[str, Any]) -> tuple[int, int]:
    """(epoch, batches yielded) of an iterator state, checked against the iterator's settings ``mine``.

    Raises ResumeStateError (a ValueError) for what is not a state of this kind, a newer
    version, other settings or data, or a position past the epoch's end.
    """
    if not isinstance(state, Mapping) or state.get("kind") != kind:
        raise ResumeStateError(
            f"not a {kind} state (expected kind {kind!r}); pass what {kind.rsplit('.', 1)[-1]}.state_dict() returned"
        )
    version = state.get("version")
    if _resume.is_int(version) and version > STATE_VERSION:
        raise ResumeStateError(
            f"the {kind} state has version {version!r}, this torchrecord reads states up to version "
            f"{STATE_VERSION}: upgrade torchrecord to resume from it"
        )
    name = kind.rsplit(".", 1)[-1]
    rules: dict[str, _resume.Rule] = {
        "kind": _resume.anything,
        "version": _resume.integer(1, STATE_VERSION),
        "epoch": _resume.integer(0),
        "yielded": _resume.integer(0),
    }
    # the data and settings must be this iterator's (saved with other ones, the order would differ)
    rules.update({key: _resume.equal(value, f"its {key}") for key, value in mine.items()})
    _resume.check_state(state, rules, where=f"{name}.load_state_dict", what=kind)
    epoch, yielded = int(state["epoch"]), int(state["yielded"])
    return epoch, yielded


def _counted(batches: Iterator[Any], owner: Any) -> Iterator[Any]:
    """Count each batch before it is handed out, so ``state_dict()`` always says what was yielded."""
    for batch in batches:
        owner._yielded += 1
        yield batch


class BatchIter:
    """Shuffled mini-batches of in-memory tensors, one ``index_select`` per field per batch.

    Each epoch visits the rows in one seeded permutation (a pure function of
    ``seed`` and the epoch: :meth:`set_epoch` picks the epoch, as with
    ``DistributedSampler``; iterating again without it repeats the order) and
    yields batches in the structure of ``data``. Every batch is made of fresh
    tensors, so it stays valid after the next step. Everything runs in the calling
    process on the tensors' device, with no worker processes: use it instead of
    ``DataLoader(TensorDataset(...))`` when the data fits in memory.

    Args:
        data: what :func:`load` returns, or any tensor, tuple (named tuples too),
            list or dict of tensors with the same first dimension, nested. A
            :class:`SampleList` leaf is batched item by item; a plain list is a
            container of fields.
        batch_size: rows per batch (the last one may be smaller); keyword-only.
        shuffle: visit the rows in a new seeded order each epoch; ``False``
            keeps the stored order.
        seed: the base seed (an int >= 0); each (seed, epoch) has its own
            independent permutation.
        drop_last: leave out the last batch when it is smaller than ``batch_size``.

    ``len()`` is the exact number of batches per epoch. :meth:`state_dict` saves
    the position within the epoch (with the epoch and the settings), and
    :meth:`load_state_dict` makes the next iteration yield exactly the rest of
    that epoch.

    Example:
        >>> x, y = torch.randn(1000, 16), torch.randint(0, 10, (1000,))
        >>> batches = BatchIter((x, y), batch_size=64, seed=1)
        >>> for epoch in range(2):
        ...     batches.set_epoch(epoch)
        ...     for xb, yb in batches:
        ...         pass
        >>> len(batches), xb.shape
        (16, torch.Size([40, 16]))
    """

    STATE_KIND = "torchrecord.BatchIter"

    def __init__(
        self, data: Any, *, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        _check_count("batch_size", batch_size)
        _check_count("seed", seed, minimum=0)
        self.columns = Columns(data)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._start = 0  # batches of the epoch the next iteration skips (a loaded state)
        self._yielded = 0  # batches the current iteration handed out
        self._iter_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (an int >= 0).

        Another epoch than a loaded state's starts from its beginning.
        """
        _check_count("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self._start = 0
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.columns.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self) -> np.ndarray:
        """The rows this epoch visits, in order (int64; without the rows ``drop_last`` leaves out)."""
        rows = self.columns.rows
        if self.shuffle:
            order = epoch_rng(self.seed, self.epoch, _SAMPLE_STREAM).permutation(rows)
        else:
            order = np.arange(rows, dtype=np.int64)
        return order[: min(rows, len(self) * self.batch_size)]

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        self._iter_epoch, self._yielded = self.epoch, start
        return _counted(self._batches(start), self)

    def _batches(self, start: int) -> Iterator[Any]:
        order = self.order()[start * self.batch_size :]
        if not len(order):
            return
        take = self.columns.take
        for indices in zip(*self.columns.index_splits(order, self.batch_size)):
            yield take(indices)

    def _settings(self) -> dict[str, Any]:
        return {
            "rows": self.columns.rows,
            "batch_size": self.batch_size,
            "shuffle": bool(self.shuffle),
            "seed": self.seed,
            "drop_last": bool(self.drop_last),
        }

    def state_dict(self) -> dict[str, Any]:
        """The position reached: the epoch, the batches yielded in it, and the settings (plain values)."""
        epoch = self._iter_epoch if self._iter_epoch is not None else self.epoch
        state: dict[str, Any] = {"kind": self.STATE_KIND, "version": STATE_VERSION, "epoch": epoch}
        state.update(self._settings())
        state["yielded"] = self._yielded if self._iter_epoch is not None else self._start
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go back to a saved position: the next iteration yields exactly the rest of its epoch.

        The epoch is set from the state. Raises ValueError for another kind of
        state, a newer version, other data or settings (rows, batch_size, shuffle,
        seed, drop_last), or a position past the end of the epoch.
        """
        epoch, yielded = _accept(state, self.STATE_KIND, self._settings())
        if yielded > len(self):
            raise ResumeStateError(
                f"the {self.STATE_KIND} state is at batch {yielded}, past the epoch's {len(self)} batches"
            )
        self.epoch, self._start, self._iter_epoch = epoch, yielded, None


class GroupBatchIter:
    """Shuffled batches of whole groups of in-memory samples, with the group offsets inside each batch.

    The samples of a group (a query and its candidates, a user and their events)
    are contiguous rows of ``data``. Each epoch visits the groups in one seeded
    permutation (a pure function of ``seed`` and the epoch; :meth:`set_epoch`),
    keeps each group's rows in their stored order, and cuts the sequence into
    batches of whole groups: ``groups_per_batch`` groups each, or as many groups
    as fit in ``max_samples`` rows (a group bigger than that forms a batch alone).
    Every sample is in exactly one batch per epoch (unless ``drop_last``), and the
    whole plan is built with array operations (no Python loop per sample or per
    group). Each item is ``(batch, offsets)``: the batch in the structure of
    ``data`` (fresh tensors), and int64[g+1] offsets of its g groups within it
    (``offsets[0] == 0``, ``offsets[-1] == len(batch)``), on the data's device.

    Args:
        data: as for :class:`BatchIter`.
        groups: group offsets, int64[G+1] (``groups[0] == 0``, ``groups[-1] == N``,
            strictly increasing), as ``RecordSet.groups`` gives them; group g is
            rows ``[groups[g], groups[g+1])``.
        group_ids: instead of ``groups``, one integer id per row; rows with equal
            ids must be contiguous (an id that reappears later raises ValueError
            naming it and both row ranges).
        groups_per_batch: whole groups per batch (the last batch may hold fewer).
        max_samples: instead of ``groups_per_batch``, fill each batch with whole
            groups while it holds at most this many rows.
        shuffle: visit the groups in a new seeded order each epoch.
        seed: the base seed (an int >= 0); each (seed, epoch) has its own
            independent permutation.
        drop_last: leave out the last batch when it holds fewer than
            ``groups_per_batch`` groups (fewer than ``max_samples`` rows).

    ``len()`` is the exact number of batches of the current epoch (with
    ``max_samples`` it depends on the epoch's order). :meth:`state_dict` and
    :meth:`load_state_dict` save and restore the position within an epoch, as
    for :class:`BatchIter`.

    Example:
        >>> x = torch.randn(10, 4)
        >>> groups = torch.tensor([0, 3, 5, 9, 10])  # 4 groups: rows 0-2, 3-4, 5-8, 9
        >>> it = GroupBatchIter((x,), groups, groups_per_batch=2, shuffle=False)
        >>> [(len(xb), offsets.tolist()) for (xb,), offsets in it]
        [(5, [0, 3, 5]), (5, [0, 4, 5])]
    """

    def __init__(
        self,
        data: Any,
        groups: Any = None,
        *,
        group_ids: Any = None,
        groups_per_batch: int | None = None,
        max_samples: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if (groups is None) == (group_ids is None):
            raise ArgumentError("give either groups= (offsets, int64[G+1]) or group_ids= (one id per row), not both")
        if (groups_per_batch is None) == (max_samples is None):
            raise ArgumentError("give either groups_per_batch= or max_samples=, exactly one of them")
        _check_count("groups_per_batch", groups_per_batch)
        _check_count("max_samples", max_samples)
        _check_count("seed", seed, minimum=0)
        self.columns = Columns(data)
        rows = self.columns.rows
        self.offsets = check_offsets(groups, rows) if groups is not None else offsets_from_ids(group_ids, rows)
        self.groups_per_batch = groups_per_batch
        self.max_samples = max_samples
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._plan: tuple[int, GroupPlan] | None = None
        self._start = 0
        self._yielded = 0
        self._iter_epoch: int | None = None

    STATE_KIND = "torchrecord.GroupBatchIter"

    @property
    def num_groups(self) -> int:
        """G, the number of groups."""
        return len(self.offsets) - 1

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (an int >= 0).

        Another epoch than a loaded state's starts from its beginning.
        """
        _check_count("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self._start = 0
        self.epoch = epoch

    def plan(self) -> GroupPlan:
        """The current epoch's rows in visiting order and its batch boundaries (cached per epoch)."""
        if self._plan is None or self._plan[0] != self.epoch:
            permutation = None
            if self.shuffle:
                permutation = epoch_rng(self.seed, self.epoch, _GROUP_STREAM).permutation(self.num_groups)
            plan = plan_epoch(
                self.offsets,
                permutation,
                groups_per_batch=self.groups_per_batch,
                max_samples=self.max_samples,
                drop_last=self.drop_last,
            )
            self._plan = (self.epoch, plan)
        return self._plan[1]

    def __len__(self) -> int:
        return len(self.plan().batch_sizes)

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor]]:
        start, self._start = self._start, 0
        self._iter_epoch, self._yielded = self.epoch, start
        return _counted(self._batches(start), self)

    def _batches(self, start: int) -> Iterator[tuple[Any, torch.Tensor]]:
        plan = self.plan()
        take = self.columns.take
        offsets = torch.split(torch.tensor(plan.offsets, device=self.columns.device), plan.offsets_sizes)
        indices = zip(*self.columns.index_splits(plan.order, plan.batch_sizes))
        for index, inner in itertools.islice(zip(indices, offsets), start, None):
            yield take(index), inner

    def _settings(self) -> dict[str, Any]:
        return {
            "rows": self.columns.rows,
            "groups": self.num_groups,
            "groups_per_batch": self.groups_per_batch,
            "max_samples": self.max_samples,
            "shuffle": bool(self.shuffle),
            "seed": self.seed,
            "drop_last": bool(self.drop_last),
        }

    def state_dict(self) -> dict[str, Any]:
        """The position reached: the epoch, the batches yielded in it, and the settings (plain values)."""
        epoch = self._iter_epoch if self._iter_epoch is not None else self.epoch
        state: dict[str, Any] = {"kind": self.STATE_KIND, "version": STATE_VERSION, "epoch": epoch}
        state.update(self._settings())
        state["yielded"] = self._yielded if self._iter_epoch is not None else self._start
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go back to a saved position: the next iteration yields exactly the rest of its epoch.

        The epoch is set from the state. Raises ValueError for another kind of
        state, a newer version, other data or settings, or a position past the
        end of the epoch.
        """
        epoch, yielded = _accept(state, self.STATE_KIND, self._settings())
        self.epoch = epoch
        if yielded > len(self):
            raise ResumeStateError(
                f"the {self.STATE_KIND} state is at batch {yielded}, past the epoch's {len(self)} batches"
            )
        self._start, self._iter_epoch = yielded, None
