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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._core.kinds import collate_samples, collate_transformed, split_columns, stack_columns
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
        schema: its schema.
        transform, collate_fn, batch_transform: the user's functions (or None).
        batch_size: samples per batch (None: single samples).
        drop_last: drop a short last batch.
    """

    path: str
    schema: Schema
    transform: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    batch_size: int | None = None
    drop_last: bool = False

    def of(self, reader: ShareReader, start: int) -> Iterator[Any]:
        """The items of ``reader``'s share from item ``start`` (samples, or batches in batch mode)."""
        return self._batches(reader, start) if self.batch_size is not None else self._samples(reader, start)

    def _samples(self, reader: ShareReader, start: int) -> Iterator[Any]:
        schema, transform = self.schema, self.transform
        step = SAMPLE_CHUNK
        if reader.layout is not None:
            step = max(1, min(step, SAMPLE_CHUNK_BYTES // max(1, sum(reader.layout.sample_bytes))))
        for chunk, indices in reader.indexed_chunks(step, start):
            samples = split_columns(chunk, schema) if reader.fixed else chunk
            if transform is None:
                yield from samples
                continue
            for sample, index in zip(samples, indices.tolist()):
                yield self._transform(transform, sample, index)

    def _transform(self, transform: Callable[[Any], Any], sample: Any, index: int) -> Any:
        """``transform(sample)``; an exception it raises keeps its type and gains a note naming the sample."""
        try:
            return transform(sample)
        except Exception as exc:
            add_note(
                exc,
                f"torchrecord: the transform failed on sample {index} of {self.path} "
                f"(RecordFile({self.path!r})[{index}] is that sample, untransformed)",
            )
            raise

    def _batches(self, reader: ShareReader, start: int) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        schema, transform, collate = self.schema, self.transform, self.collate_fn
        for chunk, indices in reader.indexed_chunks(size, start * size):
            if len(indices) < size and self.drop_last:
                return
            if transform is None and collate is None:
                batch = stack_columns(chunk, schema) if reader.fixed else collate_samples(chunk, schema)
            else:
                sources = list(split_columns(chunk, schema)) if reader.fixed else chunk
                samples = sources
                if transform is not None:
                    samples = [self._transform(transform, s, i) for s, i in zip(sources, indices.tolist())]
                try:
                    if collate is not None:
                        batch = collate(samples)
                    else:
                        batch = collate_transformed(samples, sources, schema, self.path)
                except Exception as exc:
                    add_note(exc, f"torchrecord: collating a batch of {self.path} failed ({_which(indices)})")
                    raise
            if self.batch_transform is not None:
                try:
                    batch = self.batch_transform(batch)
                except Exception as exc:
                    add_note(
                        exc, f"torchrecord: the batch_transform failed on a batch of {self.path} ({_which(indices)})"
                    )
                    raise
            yield batch


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to an exception without changing its type (shown in tracebacks, Python 3.11+)."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)


def _which(indices: np.ndarray) -> str:
    """The sample indices of a batch, shortened."""
    shown = ", ".join(str(i) for i in indices[:8].tolist())
    return f"sample indices {shown}{', ...' if len(indices) > 8 else ''}"
