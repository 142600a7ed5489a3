"""What a reader hands out: samples or whole batches, transformed and collated.

A :class:`~torchrecord._read.reader.ShareReader` gives chunks (typed columns on the
fixed-layout path, decoded samples otherwise) with the set's sample index of
each sample. :class:`Items` turns them into what the user asked for:

* per-sample mode: each sample of the kind it was written as, then ``transform``;
* batch mode: batches with fixed numeric leaves stacked and the rest as lists
  (``torchrecord._core.kinds``), the same with or without a ``transform``, or built
  by the user's ``collate_fn``; then ``batch_transform``.

An exception raised by the user's functions keeps its type and gets a note
naming the file and the sample (or the batch's samples), so a failure inside a
DataLoader worker can be traced to its record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from torchrecord._core.kinds import (
    Room,
    collate_any,
    collate_samples,
    collate_transformed,
    forget_split,
    split_columns,
    stack_columns,
)
from torchrecord._core.schema import Schema
from torchrecord._read.reader import ShareReader

__all__ = ["Items", "SAMPLE_CHUNK", "add_note"]

#: Samples read at a time when the dataset yields single samples.
SAMPLE_CHUNK = 256
#: ... but at most this many bytes of fixed-size samples: large samples (images) then come from
#: small arrays that the allocator recycles, instead of fresh pages for every chunk.
SAMPLE_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class Items:
    """How one dataset turns a reader's chunks into the items it yields.

    Attributes:
        path: the record set, for notes on errors.
        schema: its schema (None: items of no schema, e.g. robomimic windows, collated by what they hold).
        transform, collate_fn, batch_transform: the user's functions (or None).
        batch_size: samples per batch (None: single samples).
        drop_last: drop a short last batch.
        sample_chunk: per-sample mode, samples read at a time (the DataLoader's batch size when the dataset
            knows it: a batch is then one chunk, which ``torchrecord.collate`` takes without a copy); None:
            :data:`SAMPLE_CHUNK`, at most :data:`SAMPLE_CHUNK_BYTES`.
        room: where a batch collated here is built (``torchrecord._core.kinds.Room``): in a DataLoader worker
            ``torchrecord._read.ipc.slot_room``, so the batch is stacked straight into the slot it leaves in;
            None: fresh memory. A ``collate_fn`` of the user builds where it likes.
    """

    #: the dataset options an Items takes (a reader's attributes of the same names)
    OPTIONS: ClassVar[tuple[str, ...]] = ("transform", "collate_fn", "batch_transform", "batch_size", "drop_last")

    path: str
    schema: Schema | None
    transform: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    batch_size: int | None = None
    drop_last: bool = False
    room: Room | None = None
    sample_chunk: int | None = None

    def of(self, reader: ShareReader, start: int) -> Iterator[Any]:
        """The items of ``reader``'s share from item ``start`` (samples, or batches in batch mode)."""
        return self._batches(reader, start) if self.batch_size is not None else self._samples(reader, start)

    def _samples(self, reader: ShareReader, start: int) -> Iterator[Any]:
        step = SAMPLE_CHUNK
        if self.sample_chunk is not None:
            step = self.sample_chunk
        elif reader.layout is not None:
            step = max(1, min(step, SAMPLE_CHUNK_BYTES // max(1, sum(reader.layout.sample_bytes))))
        plain = self.transform is None and reader.fixed and self.schema is not None
        try:
            for chunk, indices in reader.indexed_chunks(step, start):
                if plain:
                    assert self.schema is not None
                    yield from split_columns(chunk, self.schema)  # one generator less for every sample
                else:
                    yield from self.samples(chunk, reader.fixed, indices)
        finally:
            forget_split()  # the pass is over: its last columns are the user's to keep or drop

    def samples(self, chunk: Any, fixed: bool, indices: np.ndarray | None = None) -> Iterator[Any]:
        """The samples of one chunk (typed columns when ``fixed``, else decoded samples), transformed.

        ``indices``: the set's index of each sample, named in a failing transform's note.
        """
        if fixed:
            assert self.schema is not None
            samples: Iterable[Any] = split_columns(chunk, self.schema)
        else:
            samples = chunk
        transform = self.transform
        if transform is None:
            yield from samples
        elif indices is None:
            for sample in samples:
                yield self._transform(transform, sample, None)
        else:
            for sample, index in zip(samples, indices.tolist()):
                yield self._transform(transform, sample, index)

    def _transform(self, transform: Callable[[Any], Any], sample: Any, index: int | None) -> Any:
        """``transform(sample)``; an exception it raises keeps its type and gains a note naming the sample."""
        try:
            return transform(sample)
        except Exception as exc:
            if index is None:
                add_note(exc, f"torchrecord: the transform failed on a sample of {self.path}")
            else:
                add_note(
                    exc,
                    f"torchrecord: the transform failed on sample {index} of {self.path} "
                    f"(RecordFile({self.path!r})[{index}] is that sample, untransformed)",
                )
            raise

    def _batches(self, reader: ShareReader, start: int) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        # what batch() does on the fixed path without the user's functions, without its steps a batch
        schema = self.schema if reader.fixed and self._plain else None
        for chunk, indices in reader.indexed_chunks(size, start * size, tensors=schema is not None):
            if len(indices) < size and self.drop_last:
                return
            yield stack_columns(chunk, schema) if schema is not None else self.batch(chunk, reader.fixed, indices)

    @property
    def _plain(self) -> bool:
        """No function of the user's between the chunk and the batch."""
        return self.transform is None and self.collate_fn is None and self.batch_transform is None

    def whole_batches(self, reader: ShareReader, sample: int, size: int) -> Iterator[tuple[Any, int]]:
        """Per-sample mode read as whole batches of ``size`` samples from sample ``sample`` (a RecordLoader's
        fast path): each ``(batch, samples in it)``, the batch what collating those samples gives, the last one
        short (a DataLoader in per-sample mode keeps it)."""
        for chunk, indices in reader.indexed_chunks(size, sample):
            yield _as_default_collate(self.batch(chunk, reader.fixed, indices)), len(indices)

    def batch(self, chunk: Any, fixed: bool, indices: np.ndarray | None = None) -> Any:
        """One batch of a chunk: collated (by the schema, or by ``collate_fn``), then ``batch_transform``.

        ``chunk`` holds typed columns when ``fixed``, else samples (decoded ones, or
        for a dataset without a schema its items). ``indices`` name the samples in notes.
        """
        schema, transform, collate, room = self.schema, self.transform, self.collate_fn, self.room
        if transform is None and collate is None and schema is not None:
            batch = stack_columns(chunk, schema) if fixed else collate_samples(chunk, schema, room)
        else:
            sources = list(split_columns(chunk, schema)) if fixed and schema is not None else list(chunk)
            samples = sources
            if transform is not None:
                if indices is None:
                    samples = [self._transform(transform, s, None) for s in sources]
                else:
                    samples = [self._transform(transform, s, i) for s, i in zip(sources, indices.tolist())]
            try:
                if collate is not None:
                    batch = collate(samples)
                elif schema is not None:
                    batch = collate_transformed(samples, sources, schema, self.path, room)
                else:
                    batch = collate_any(samples, self.path, room)
            except Exception as exc:
                add_note(exc, f"torchrecord: collating a batch of {self.path} failed ({_which(indices)})")
                raise
        return self.finish(batch, indices)

    def finish(self, batch: Any, indices: np.ndarray | None = None) -> Any:
        """A collated batch after ``batch_transform`` (itself without one)."""
        if self.batch_transform is not None:
            try:
                batch = self.batch_transform(batch)
            except Exception as exc:
                add_note(exc, f"torchrecord: the batch_transform failed on a batch of {self.path} ({_which(indices)})")
                raise
        return batch


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to an exception without changing its type (shown in tracebacks, Python 3.11+)."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)


def _which(indices: np.ndarray | None) -> str:
    """The sample indices of a batch, shortened."""
    if indices is None:
        return "its samples are not indexed"
    shown = ", ".join(str(i) for i in indices[:8].tolist())
    return f"sample indices {shown}{', ...' if len(indices) > 8 else ''}"


def _as_default_collate(batch: Any) -> Any:
    """A batch of the schema's structure as ``default_collate`` shapes it: its tuples become lists."""
    if type(batch) is tuple or type(batch) is list:
        return [_as_default_collate(part) for part in batch]
    if type(batch) is dict:
        return {key: _as_default_collate(part) for key, part in batch.items()}
    return batch
