"""StreamDataset: batch position b continues the same sequence, for any number of workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from torchrecord._core.kinds import as_tensor, split_columns
from torchrecord._core.layout import FixedLayout
from torchrecord._core.structure import first_difference, flatten, unflatten
from torchrecord._order.plan import Part, Reader, runs_of
from torchrecord._order.share import Share
from torchrecord._order.stream_plan import Cells, Steps, StreamEpochPlan, StreamPlan, plan_streams
from torchrecord._read.base import ReaderDataset
from torchrecord._read.items import add_note
from torchrecord._read.reader import ShareReader
from torchrecord._read.record_block import RecordBlock
from torchrecord._read.state import Start
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc
from torchrecord._store.fastread import FixedWindowReader
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, SchemaError

__all__ = ["StreamDataset"]

STATE_KIND = "torchrecord.StreamDataset"


class StreamDataset(ReaderDataset):
    """Sequence streams from a grouped record set: position b of batch t+1 continues position b of batch t.

    For models that carry hidden state from one batch to the next (an RNN or a
    transducer over long audio, a language model over documents cut in chunks).
    Each group of the set (``write_record(..., group_by=...)``) is one sequence.
    Every epoch, the sequences are put in a seeded order and dealt to
    ``world_size x batch_size`` streams, each next sequence to the stream with the
    fewest frames so far; rank r owns streams ``[r*B, (r+1)*B)``. A batch holds
    ``steps`` consecutive frames of each of the rank's B streams::

        {"data": the sample's structure, each leaf [B, steps, ...],
         "mask": bool[B, steps]      (False on padding),
         "start": bool[B, steps]     (True where a sequence begins: reset state there),
         "sequence": int64[B, steps] (the group index, -1 on padding)}

    Workers: use ``DataLoader(ds, batch_size=None, num_workers=n)`` (in-order
    delivery, the default). Worker w builds only the batches t with
    ``t % n == w``, so batches are built in parallel across time steps; the
    DataLoader hands them out in order, so the result is identical for any number
    of workers. :meth:`check_loader` refuses a DataLoader that would break that.
    Each frame is read by the worker whose batch holds it: a worker reads the
    frames of up to 64 of its batches at once, as the whole records they live in
    (each record once per group, looked up by key: ``_record_block``), and
    gathers each batch straight from them. A worker's batches up to 512 KB cross
    to the main process by value through its pipe, larger ones as one
    shared-memory block (``_ipc.for_parent``). Each handover has a fixed cost:
    for small batches (``steps=1``) use :class:`torchrecord.StreamLoader`, which
    hands over bundles of consecutive batches and yields the same batches.

    Args:
        path: a grouped record set (a path or a :class:`~torchrecord.RecordSet`).
        batch_size: streams per rank (B).
        steps: consecutive frames per stream in one batch.
        shuffle: a new sequence order (and so new streams) every epoch.
        seed: the base seed of the order.
        drop_last: ``False`` runs until the longest stream ends (nothing lost,
            nothing repeated; padding cells are zeros with mask False); ``True``
            until the shortest ends, cutting the streams to whole ``steps`` (every
            cell valid; :attr:`dropped` frames are left out).
        transform: called on each frame's decoded sample before batching.
        batch_transform: called on each batch (the dict above) once it is built,
            in the worker.
        rank, world_size: override what ``torch.distributed`` reports.
        check: integrity on read: ``"checksums"`` checks each record's CRC-32 as
            it is read, ``"structure"`` the file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`),
            ``"full"`` both.

    ``len()`` is the number of batches per rank per epoch, the same on every rank.
    """

    STATE_KIND = STATE_KIND

    def __init__(
        self,
        path: SetLike,
        *,
        batch_size: int,
        steps: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        check: Check | None = None,
    ) -> None:
        self._init_reader(locals(), batch_required=True)
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ArgumentError(f"steps must be an integer >= 1, got {steps!r}")
        self.file: RecordSet = open_set(path, check=self.check)
        if self.file.groups is None:
            raise ArgumentError(
                f"{self.file.path}: the set has no groups; write it with write_record(..., group_by=...) "
                "so that each sequence is one group"
            )
        self.file.close()
        self.steps = int(steps)
        self._plan_cache: tuple[tuple[int, int], StreamPlan] | None = None
        self.records_read = 0  # records this process read (for tests and benchmarks)
        self._template: Any = None  # a transformed frame, to shape batches that hold padding only

    # -- configuration ------------------------------------------------------
    batch_size: int

    def _set_id(self) -> str:
        return self.file.set_id

    def _where(self) -> str:
        return self.file.path

    def _world(self) -> tuple[int, int]:
        """(rank, world size): given, or read from torch.distributed in the main process (see ``_world``)."""
        self._refresh_distributed()
        return self._distributed

    def plan(self) -> StreamPlan:
        """This epoch's streams over all ranks (a pure function of seed, epoch and world size)."""
        world = self._world()[1]
        key = (self.epoch, world)
        if self._plan_cache is None or self._plan_cache[0] != key:
            offsets = self.file.groups
            assert offsets is not None
            plan = plan_streams(
                offsets,
                streams=world * self.batch_size,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                tail="drop" if self.drop_last else "pad",
                steps=self.steps,
            )
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    @property
    def dropped(self) -> int:
        """Frames of this epoch no batch of any rank holds (``drop_last=True``; 0 without).

        The frames the ranks' batches hold plus ``dropped`` are every frame of the set:
        the frames past the shortest stream's end, and those of a last partial batch.
        """
        return self.plan().dropped

    def __len__(self) -> int:
        """Batches per rank per epoch, the same on every rank."""
        total = self.plan().steps_per_epoch
        return total // self.steps if self.drop_last else -(-total // self.steps)

    def _per_rank(self) -> int:
        return len(self) * self.batch_size * self.steps

    def __repr__(self) -> str:
        return (
            f"StreamDataset({self.file.path!r}, batch_size={self.batch_size}, steps={self.steps}, "
            f"drop_last={self.drop_last}, epoch={self.epoch})"
        )

    def _loader_problem(self, loader: Any) -> str | None:
        """Why ``loader`` would not deliver this dataset's batches whole and in order, or None."""
        size = getattr(loader, "batch_size", None)
        if size is not None:
            return (
                f"{self.file.path}: StreamDataset builds whole batches: use DataLoader(ds, batch_size=None), not "
                f"batch_size={size}"
            )
        if getattr(loader, "in_order", True) is False:
            return f"{self.file.path}: StreamDataset needs in-order delivery: DataLoader(..., in_order=True)"
        return None

    # -- the contract -----------------------------------------------------------
    RESUME_ADVICE = (
        "the streams would differ and hidden state could not follow: resume with the same batch size, world size, "
        "steps, seed, shuffle and drop_last"
    )
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "seed": "its seed",
        "shuffle": "its shuffle",
        "drop_last": "its drop_last",
        "streams": "its streams (world size x batch_size)",
        "batch_size": "its batch_size",
        "steps": "its steps",
    }

    def _plan_keys(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "streams": self._world()[1] * self.batch_size,
            "batch_size": self.batch_size,
            "steps": self.steps,
        }

    def _epoch_plan(self) -> StreamEpochPlan:
        return StreamEpochPlan(len(self))

    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        assert isinstance(part, Steps)
        for _, batch in self._build_steps(part.batches(start.yielded)):
            yield batch

    def batches(self, worker: int = 0, num_workers: int = 1) -> Iterator[dict[str, Any]]:
        """One worker's part of this rank's epoch: batches ``worker``, ``worker + num_workers``, ... in order.

        A DataLoader takes one batch from each worker in turn, so the workers'
        parts interleave back into batches ``0, 1, ...``.
        """
        rank, world = self._world()
        part = self._epoch_plan().part(Reader(rank, world, worker, num_workers))
        for _, batch in self._build_steps(part.batches()):
            yield batch

    def _batch_bytes(self) -> int | None:
        return self._frames_bytes(self.file.fixed_layout())

    def _build_steps(self, steps: Sequence[int]) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(t, batch t)`` for the batch indices ``steps``, in that order, read a group of batches at a time."""
        plan = self.plan()
        streams = self._streams()
        layout = self.file.fixed_layout()
        per_read = self._batches_per_read(layout)
        reader: FixedWindowReader | None = None  # recycles its window buffer from group to group
        i = 0
        while i < len(steps):
            group = steps[i : i + (1 if i == 0 else per_read)]  # the first batch alone: it comes sooner
            i += len(group)
            cells = plan.batch_cells(streams, [t * self.steps for t in group], self.steps)
            if layout is not None:
                if reader is None:
                    reader = FixedWindowReader(layout, cells.sample.size)
                chunks = self._read_block(cells.sample, layout, reader)
            else:
                chunks = self._read_many([c[c >= 0] for c in cells.sample.reshape(len(group), -1)])
            for j, (t, chunk) in enumerate(zip(group, chunks)):
                batch = self._build(cells, j, chunk, layout)
                if self.batch_transform is not None:
                    try:
                        batch = self.batch_transform(batch)
                    except Exception as exc:
                        add_note(exc, f"torchrecord: the batch_transform failed on batch {t} of {self.file.path}")
                        raise
                yield t, batch

    def _batches_per_read(self, layout: FixedLayout | None) -> int:
        """How many of a worker's batches one read serves: about 8 MiB of frames, at most 64 batches.

        Reading several batches at once reads each record they share once and
        spreads the per-read costs (one lookup of their cells, one sort of their
        records) over many batches, which is what makes ``steps=1`` fast.
        """
        return int(max(1, min(64, (8 << 20) // self._frames_bytes(layout))))

    def _frames_bytes(self, layout: FixedLayout | None) -> int:
        """The stored bytes of one batch's frames (16 KB a frame where the layout is not fixed)."""
        frame_bytes = layout.length // max(1, layout.rows) if layout is not None else 16 << 10
        return max(1, frame_bytes * self.batch_size * self.steps)

    def _streams(self) -> range:
        """The streams this rank plays: [rank * B, (rank + 1) * B)."""
        rank = self._world()[0]
        return range(rank * self.batch_size, (rank + 1) * self.batch_size)

    def _build(self, cells: Cells, j: int, chunk: Any, layout: FixedLayout | None) -> dict[str, Any]:
        """Batch ``j`` of a group: ``chunk`` holds its frames (see :meth:`_read_block`, :meth:`_read_many`)."""
        sample = cells.sample[j]
        b, steps = sample.shape
        mask = sample >= 0
        if layout is not None and self.transform is None:  # chunk: the cells' columns, padding included
            data = unflatten(
                self.file.schema.tree,
                [as_tensor(c.reshape(b, steps, *c.shape[1:]), f.dtype) for c, f in zip(chunk, self.file.schema.fields)],
            )
        else:
            frames = list(split_columns(chunk, self.file.schema)) if layout is not None else list(chunk)
            if self.transform is not None:
                frames = [self.transform(s) for s in frames]
            if frames:
                self._template = frames[0]
                data = _collate_cells(frames, np.flatnonzero(mask), b * steps, (b, steps), self._frame_where(cells, j))
            else:  # every cell is padding: zeros shaped like a (transformed) frame
                data = _padding_cells(self._frame_template(), b * steps, (b, steps))
        return {
            "data": data,
            "mask": torch.from_numpy(mask),
            "start": torch.from_numpy(cells.start[j]),
            "sequence": torch.from_numpy(cells.sequence[j]),
        }

    def _frame_where(self, cells: Cells, j: int) -> Callable[[int], str]:
        """Names frame i of batch j's valid cells (row-major): its file, stored sample and sequence."""
        valid = cells.sample[j] >= 0

        def where(i: int) -> str:
            sample, sequence = int(cells.sample[j][valid][i]), int(cells.sequence[j][valid][i])
            return f"{self.file.path}: sample {sample} (sequence {sequence})"

        return where

    def _frame_template(self) -> Any:
        """A transformed frame: the last one built, or else the set's first frame transformed."""
        if self._template is None:
            frame = self.file[0]
            self._template = self.transform(frame) if self.transform is not None else frame
        return self._template

    def _read_block(self, sample: np.ndarray, layout: FixedLayout, reader: FixedWindowReader) -> list[Any]:
        """Each batch's columns from one read of every record a group's frames live in (``_record_block``).

        ``sample`` is the group's [batches, B, steps] stored samples (-1 on padding).
        Without a transform a batch's columns hold every cell, zeros on padding;
        with one, only the valid cells in row-major order (the frames to transform).
        """
        flat = sample.reshape(len(sample), -1)
        block = RecordBlock(self.file, layout, flat[flat >= 0], verify=checks_crc(self.check), reader=reader)
        try:
            if self.transform is None:
                return block.columns_many(flat)
            return [block.columns(row[row >= 0]) for row in flat]
        finally:
            block.close()
            self.records_read += block.records_read

    def _read_many(self, wanted: list[np.ndarray]) -> list[Any]:
        """The stored samples of several batches (each array in its order), read together in index order.

        The path for sets without a fixed layout (samples decoded by protobuf).
        """
        every = np.concatenate(wanted) if wanted else np.zeros(0, np.int64)
        order = np.argsort(every, kind="stable")
        chunk = self._read_stored(every[order])
        position = np.empty(len(every), np.int64)
        position[order] = np.arange(len(every), dtype=np.int64)
        out: list[Any] = []
        lo = 0
        for samples in wanted:
            rows = position[lo : lo + len(samples)]
            lo += len(samples)
            out.append([chunk[j] for j in rows.tolist()])
        return out

    def _read_stored(self, samples: np.ndarray) -> list[Any]:
        """The stored samples ``samples`` (sorted) through the read layer: one cursor seek per run."""
        if not len(samples):  # every cell is padding (this rank's streams have ended)
            return []
        share = Share.in_order(tuple(runs_of(samples)))
        reader = ShareReader(self.file, share, layout=None, verify=checks_crc(self.check))
        chunk = next(reader.chunks(len(samples)))
        self.records_read += reader.records_read
        return list(chunk)


def _padding_cells(template: Any, cells: int, lead: tuple[int, int]) -> Any:
    """A batch of padding only, shaped like ``template`` (a transformed frame): zeros, or None in lists."""
    tree, leaves = flatten(template)
    out: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(torch.zeros((*lead, *leaf.shape), dtype=leaf.dtype))
        elif isinstance(leaf, (np.ndarray, np.generic, int, float, bool)) and np.asarray(leaf).dtype != object:
            out.append(torch.zeros((*lead, *np.shape(leaf)), dtype=torch.from_numpy(np.asarray(leaf)).dtype))
        else:
            out.append([[None] * lead[1] for _ in range(lead[0])])
    return unflatten(tree, out)


def _collate_cells(
    frames: list[Any], flat: np.ndarray, cells: int, lead: tuple[int, int], where: Callable[[int], str]
) -> Any:
    """Frames (any structure) into leaves [B, steps, ...]: stacked where every frame's leaf has one shape.

    Padding cells are zeros in stacked leaves and None in the nested lists of the others.
    Every frame must have the first one's structure (``where(i)`` names frame i in the error).
    """
    if not frames:
        return None
    first = frames[0]
    if type(first) is dict and not any(isinstance(v, (Mapping, list, tuple)) for v in first.values()):
        keys = first.keys()  # a flat dict of leaves (the common case): columns by key, no flattening
        if all(type(f) is dict and f.keys() == keys for f in frames):
            return {k: _cells_leaf([f[k] for f in frames], flat, cells, lead) for k in keys}
    tree, _ = flatten(first)
    flattened = [flatten(f) for f in frames]
    for i, (other, _) in enumerate(flattened):
        if other != tree:
            name, *_ = first_difference(tree, other) or ("",)
            raise SchemaError(
                f"{where(i)}: the transform returned a frame whose structure differs from the batch's first frame "
                f"(at {name or 'the top level'}); every frame of a batch must have one structure"
            )
    columns = list(zip(*(leaves for _, leaves in flattened)))
    return unflatten(tree, [_cells_leaf(list(column), flat, cells, lead) for column in columns])


def _cells_leaf(column: list[Any], flat: np.ndarray, cells: int, lead: tuple[int, int]) -> Any:
    """One leaf of every valid cell into [B, steps, ...]: stacked (zeros on padding), else nested lists (None)."""
    stacked: torch.Tensor | None = None
    kind = type(column[0])
    if all(type(x) is kind for x in column) and kind is not torch.Tensor and issubclass(kind, _NUMERIC):
        if kind is not np.ndarray or len({x.shape for x in column}) == 1:
            array = np.array(column)  # one C call: numbers of one type, or arrays of one shape
            if array.dtype != object:
                stacked = torch.from_numpy(array)
    elif all(isinstance(x, torch.Tensor) for x in column) and len({x.shape for x in column}) == 1:
        stacked = torch.stack(column)
    elif all(isinstance(x, _NUMERIC) for x in column):
        arrays = [np.asarray(x) for x in column]
        if len({a.shape for a in arrays}) == 1 and arrays[0].dtype != object:
            stacked = torch.from_numpy(np.stack(arrays))
    if stacked is not None:
        if len(flat) == cells:  # no padding
            return stacked.reshape(*lead, *stacked.shape[1:])
        out = torch.zeros((cells, *stacked.shape[1:]), dtype=stacked.dtype)
        out[torch.from_numpy(flat)] = stacked
        return out.reshape(*lead, *stacked.shape[1:])
    grid: list[Any] = [None] * cells
    for i, value in zip(flat.tolist(), column):
        grid[i] = value
    return [grid[r * lead[1] : (r + 1) * lead[1]] for r in range(lead[0])]


_NUMERIC = (np.ndarray, np.generic, int, float, bool)
