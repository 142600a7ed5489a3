"""Frames by stored record index: some fields cached in contiguous arrays, the rest read from the file.

The window datasets ask for fields at arrays of record indices (any shape, with
repeats: padding repeats frames, neighbouring windows share them). A
:class:`FrameStore` answers from

* its cache: the chosen fields of the chosen records, copied once per process
  into one contiguous array per field (optionally cast, e.g. to float32), with
  a record -> row table; no Python object per frame or window;
* the file: a :class:`Block` reads the union of the records a batch (or a whole
  buffer of windows) needs, each record once, through the read layer
  (``ShareReader`` over runs of consecutive records), then every request is a
  gather from it.

Records are sample indices. Past the samples, index ``len(file) + d`` is demo
``d``'s final ``next_obs`` frames (``torchrecord._robomimic.episodes.FinalFrames``,
kept outside the samples), when the store is given them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.structure import flatten
from torchrecord._order.plan import runs_of
from torchrecord._order.share import Share
from torchrecord._read.reader import ShareReader
from torchrecord._robomimic.episodes import FinalFrames
from torchrecord._store.record_set import RecordSet

__all__ = ["Block", "FrameStore", "record_runs_of"]

#: Records read per step while filling the cache: about this many bytes.
_FILL_BYTES = 16 << 20

Run = tuple[int, int]


def record_runs_of(records: np.ndarray) -> tuple[Run, ...]:
    """Runs [start, stop) of consecutive indices in sorted, unique ``records``."""
    return tuple(runs_of(records))


@dataclass
class Block:
    """Some fields of the sorted unique ``records``, read from the file once."""

    records: np.ndarray
    columns: dict[str, np.ndarray]

    def take(self, name: str, rec: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(self.records, rec)
        return self.columns[name][rows]


class FrameStore:
    """Fields of a record set by record index, from a per-process cache or from the file.

    Args:
        file: the record set (fixed-shape numeric fields).
        cached: field name -> dtype to cache it as (None: its stored dtype).
        cache_records: the records whose cached fields are held (sorted, unique).
        verify: check each record's CRC-32 as it is read.
        finals: the final frames, read as the records past the samples (fields
            without a final frame read as zeros there).

    The cache is filled on first use in each process (:meth:`fill` fills it
    now); the store pickles without it.
    """

    def __init__(
        self,
        file: RecordSet,
        cached: dict[str, np.dtype[Any] | None],
        cache_records: np.ndarray,
        *,
        verify: bool,
        finals: FinalFrames | None = None,
    ) -> None:
        self.file, self.cached, self.verify, self.finals = file, dict(cached), verify, finals
        self.samples = len(file)
        self.size = self.samples + (finals.demos if finals is not None else 0)  # indices: samples, then finals
        self.cache_records = np.asarray(cache_records, dtype=np.int64)
        self.fields = {f.name: i for i, f in enumerate(file.schema.fields)}
        self._cache: dict[str, np.ndarray] | None = None
        self._row_of: np.ndarray | None = None
        self.records_read = 0  # records this process read from the file

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": None, "_row_of": None, "records_read": 0}

    # -- shapes -------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d or 0) for d in self.file.schema.fields[self.fields[name]].shape)

    def dtype(self, name: str) -> np.dtype[Any]:
        """The dtype ``take`` gives for ``name``."""
        cast = self.cached.get(name)
        if cast is not None:
            return np.dtype(cast)
        return np.dtype(_dtypes.by_name(self.file.schema.fields[self.fields[name]].dtype).numpy)

    @property
    def cache_bytes(self) -> int:
        """Bytes the cache holds in this process (0 before it is filled)."""
        return sum(a.nbytes for a in (self._cache or {}).values())

    # -- the cache ------------------------------------------------------------------
    def fill(self) -> None:
        """Fill the cache in this process (once)."""
        if self._cache is not None:
            return
        n = len(self.cache_records)
        cache = {name: np.empty((n, *self.shape(name)), self.dtype(name)) for name in self.cached}
        row_of = np.full(self.size, -1, np.int64)
        row_of[self.cache_records] = np.arange(n, dtype=np.int64)
        if cache and n:
            frame = sum(
                int(np.prod(self.shape(f.name), dtype=np.int64)) * _dtypes.by_name(f.dtype).itemsize
                for f in self.file.schema.fields
            )
            step = max(1, _FILL_BYTES // max(1, frame))
            pos = 0
            for columns in self._read(record_runs_of(self.cache_records), list(cache), step):
                k = len(next(iter(columns.values())))
                for name, out in cache.items():
                    out[pos : pos + k] = columns[name]
                pos += k
            assert pos == n
        self._cache, self._row_of = cache, row_of

    def is_cached(self, name: str) -> bool:
        return name in self.cached

    # -- reading --------------------------------------------------------------------
    def block(self, records: Iterable[np.ndarray], names: Sequence[str]) -> Block:
        """Fields ``names`` of the union of ``records`` (arrays of any shape), each record read once."""
        parts = [np.asarray(r, dtype=np.int64).reshape(-1) for r in records]
        wanted = np.unique(np.concatenate(parts)) if parts and names else np.zeros(0, np.int64)
        if not len(wanted):
            return Block(wanted, {})
        chunks = list(self._read(record_runs_of(wanted), names, len(wanted)))
        if len(chunks) == 1:
            return Block(wanted, chunks[0])
        return Block(wanted, {name: np.concatenate([c[name] for c in chunks]) for name in names})

    def take(self, name: str, rec: np.ndarray, block: Block | None) -> np.ndarray:
        """Field ``name`` at records ``rec``: an array of shape ``rec.shape + frame shape``."""
        if name in self.cached:
            self.fill()
            assert self._cache is not None and self._row_of is not None
            flat = self._cache[name][self._row_of[rec.reshape(-1)]]
        else:
            assert block is not None, f"field {name!r} is not cached: read a block first"
            flat = block.take(name, rec.reshape(-1))
        out: np.ndarray = flat.reshape(*rec.shape, *flat.shape[1:])
        return out

    def _read(self, runs: tuple[Run, ...], names: Sequence[str], step: int) -> Iterable[dict[str, np.ndarray]]:
        """Fields ``names`` of the records in ``runs`` (sorted), ``step`` records at a time, in run order."""
        n = self.samples
        stored = tuple((a, min(b, n)) for a, b in runs if a < n)
        finals = np.concatenate([np.arange(max(a, n), b) for a, b in runs if b > n] or [np.zeros(0, np.int64)])
        if stored:
            yield from self._read_stored(stored, names, step)
        for at in range(0, len(finals), step):
            demos = finals[at : at + step] - n
            assert self.finals is not None, "a record past the samples without final frames"
            got = self.finals.read(demos, [m for m in names if m in self.finals.spans], verify=self.verify)
            self.records_read += len(demos)
            yield {m: self._cast(m, got[m] if m in got else self._zeros(m, len(demos))) for m in names}

    def _zeros(self, name: str, k: int) -> np.ndarray:
        field = self.file.schema.fields[self.fields[name]]
        return np.zeros((k, *self.shape(name)), _dtypes.by_name(field.dtype).numpy)

    def _read_stored(self, runs: tuple[Run, ...], names: Sequence[str], step: int) -> Iterable[dict[str, np.ndarray]]:
        file = self.file
        layout = file.fixed_layout()
        share = dataclasses.replace(Share.in_order(runs), window=step)
        reader = ShareReader(file, share, layout=layout, verify=self.verify)
        try:
            for chunk in reader.chunks(step):
                if layout is not None:
                    yield {name: self._cast(name, chunk[self.fields[name]]) for name in names}
                else:
                    leaves = [flatten(sample)[1] for sample in chunk]
                    yield {name: self._cast(name, np.stack([lv[self.fields[name]] for lv in leaves])) for name in names}
        finally:
            self.records_read += reader.records_read

    def _cast(self, name: str, column: np.ndarray) -> np.ndarray:
        cast = self.cached.get(name)
        return column if cast is None or column.dtype == cast else column.astype(cast)
