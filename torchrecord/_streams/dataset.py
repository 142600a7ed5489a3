"""StreamDataset: batch position b continues the same sequence, for any number of workers."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from torchrecord._core.kinds import as_tensor, split_columns
from torchrecord._core.layout import FixedLayout
from torchrecord._core.structure import first_difference, flatten, unflatten
from torchrecord._order.stream_plan import Cells, StreamPlan, plan_streams
from torchrecord._read import resume as _resume
from torchrecord._read.base import ReaderDataset, current_worker, in_worker
from torchrecord._read.ipc import for_parent
from torchrecord._read.items import add_note
from torchrecord._read.reader import Share, ShareReader
from torchrecord._read.record_block import RecordBlock
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc
from torchrecord._store.fastread import FixedWindowReader
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, ResumeStateError, SchemaError

__all__ = ["StreamDataset"]

STATE_KIND = "torchrecord.StreamDataset"
_PLAN_KEYS = ("seed", "shuffle", "drop_last", "streams", "batch_size", "steps")


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
    RETIRED_STATE_KEYS: ClassVar[Mapping[str, str]] = {"tail": "drop_last"}

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
        self._init_reader(
            rank,
            world_size,
            batch_required=True,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            transform=transform,
            batch_transform=batch_transform,
            check=check,
        )
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
        self._resume: dict[str, Any] | None = None
        self._next_step = 0
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

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        worker, workers = current_worker()
        resume, self._resume = self._resume, None
        if resume is None:
            return self.batches(worker, workers)
        if (resume["worker"], resume["num_workers"]) == (worker, workers):
            # this worker's own saved state (torchdata loads each worker's copy with its own and
            # restores the loader's rotation): go on with exactly the step it would build next
            return self.batches(worker, workers, first=resume["step"])
        # a merged position: a fresh DataLoader's rotation starts at worker 0 and step `step`
        return self.batches(worker, workers, start=resume["step"])

    def batches(
        self, worker: int = 0, num_workers: int = 1, start: int = 0, *, first: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """One worker's part: batches ``start + worker``, ``start + worker + num_workers``, ... in order.

        A DataLoader takes one batch from each worker in turn, so the workers'
        parts interleave back into batches ``start, start + 1, ...``. ``first``
        overrides the first step (a worker resuming its own saved state).
        """
        if first is None:
            first = start + worker
        # set now, not when the generator first runs: a StatefulDataLoader asks a worker for its
        # state before that worker has built anything (worker 1 after the loader's first batch)
        self._next_step = first
        return self._batches_from(first, num_workers)

    def _batches_from(self, first: int, num_workers: int) -> Iterator[dict[str, Any]]:
        in_a_worker = in_worker()
        for t, batch in self._build_steps(range(first, len(self), num_workers)):
            self._next_step = t + num_workers
            yield for_parent(batch) if in_a_worker else batch

    def _build_steps(self, steps: Sequence[int]) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(t, batch t)`` for the batch indices ``steps``, in that order, read a group of batches at a time."""
        plan = self.plan()
        streams = self._streams()
        layout = FixedLayout.of_file(self.file)
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
        return int(max(1, min(64, (8 << 20) // self._batch_bytes(layout))))

    def _batch_bytes(self, layout: FixedLayout | None) -> int:
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
        chunk = self._read(every[order])
        position = np.empty(len(every), np.int64)
        position[order] = np.arange(len(every), dtype=np.int64)
        out: list[Any] = []
        lo = 0
        for samples in wanted:
            rows = position[lo : lo + len(samples)]
            lo += len(samples)
            out.append([chunk[j] for j in rows.tolist()])
        return out

    def _read(self, samples: np.ndarray) -> list[Any]:
        """The stored samples ``samples`` (sorted) through the read layer: one cursor seek per run."""
        if not len(samples):  # every cell is padding (this rank's streams have ended)
            return []
        breaks = np.flatnonzero(np.diff(samples) != 1) + 1
        bounds = np.concatenate(([0], breaks, [len(samples)]))
        runs = tuple((int(samples[a]), int(samples[e - 1]) + 1) for a, e in itertools.pairwise(bounds))
        share = Share(runs, self.seed, self.epoch, 0, 0, shuffle=False, window=len(samples))
        reader = ShareReader(self.file, share, layout=None, verify=checks_crc(self.check))
        chunk = next(reader.chunks(len(samples)))
        self.records_read += reader.records_read
        return list(chunk)

    # -- resume -------------------------------------------------------------------
    def _plan_state(self) -> dict[str, Any]:
        world = self._world()[1]
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "streams": world * self.batch_size,
            "batch_size": self.batch_size,
            "steps": self.steps,
        }

    def state_dict(self) -> dict[str, Any]:
        """The step this reader builds next: small, plain, JSON-serialisable."""
        state = self._state_header(self.reader(), self.epoch)
        state["next_step"] = self._next_step
        state.update(self._plan_state())
        return state

    def load_state_dict(self, state: Any) -> None:
        """Resume from a state, or from any nesting of several (e.g. a whole loader state).

        The batches continue at the earliest step any of the states would build
        next, so a resume with another number of workers continues identically.
        Raises ValueError for another set, a later epoch, a newer state version,
        or another number of streams, steps or order (hidden state cannot follow).
        """
        found = list(_resume.find_states(state, (STATE_KIND,)))
        if not found:
            raise ResumeStateError(f"{self.file.path}: no StreamDataset state found in what was given")
        mine = self._plan_state()
        advice = (
            "the streams would differ and hidden state could not follow: resume with the same batch size, world "
            "size, steps, seed, shuffle and drop_last"
        )
        accepted = [self._accept_state(s, plan=mine, plan_keys=_PLAN_KEYS, advice=advice) for s in found]
        kept = [s for s in accepted if s is not None]
        for s in kept:
            self._check_resume(s, mine)
        if not kept:
            self._resume = None
        elif len(kept) == 1:
            s = kept[0]
            self._resume = {"step": int(s["next_step"]), "worker": s.get("worker"), "num_workers": s.get("num_workers")}
        else:
            self._resume = {"step": min(int(s["next_step"]) for s in kept), "worker": None, "num_workers": None}

    def _check_resume(self, state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
        """Every field of an accepted state against this dataset (states are untrusted input)."""
        r = _resume
        where, kind = self._where(), STATE_KIND
        world = self._world()[1]
        rules: dict[str, r.Rule] = {key: r.anything for key in ("kind", "version", "set_id", "epoch")}
        rules.update({key: r.equal(mine[key], f"its {key}") for key in _PLAN_KEYS})
        rules.update(
            rank=r.integer(0, world - 1, what="the last rank of its world"),
            world_size=r.equal(world, "its world size"),
            worker=r.integer(0, r.MAX_READERS, none=True),
            num_workers=r.integer(1, r.MAX_READERS, none=True),
            next_step=r.integer(0),
        )
        r.check_state(state, rules, where=where, what=kind)
        worker, workers = state["worker"], state["num_workers"]
        if (worker is None) != (workers is None) or (workers is not None and worker >= workers):
            r.refuse(
                where,
                kind,
                "worker",
                worker,
                f"must be a worker of num_workers={workers!r} (both None for a loader's state)",
            )
        # a worker's state names the step it builds next: up to num_workers - 1 past the last
        last = len(self) + (workers - 1 if workers is not None else 0)
        if state["next_step"] > last:
            r.refuse(where, kind, "next_step", state["next_step"], f"the epoch has {len(self)} batches")


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
