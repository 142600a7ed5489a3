"""Every record that holds one of some samples, read once, then gathered into cells.

``StreamDataset`` asks for the frames of a worker's group of batches: short runs
of samples scattered over the file (one run per stream and sequence). Reading
them as runs of samples re-reads a packed record for every run that touches it
and copies each run out piece by piece. A :class:`RecordBlock` instead reads the
union of the records those samples live in, each record once and in stored
order, each looked up by its key (``Walk.records_at``), through the checked
fixed-layout path (``torchrecord._store.fastread``); every batch is then one gather
per field from the block, straight into its cells.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.kinds import check_bools
from torchrecord._core.layout import FixedLayout
from torchrecord._read.shard_walks import ShardWalks
from torchrecord._store.fastread import FixedWindow, FixedWindowReader
from torchrecord._store.record_set import RecordSet

__all__ = ["RecordBlock"]


class RecordBlock:
    """The records holding ``samples`` (set indices, any order, repeats allowed), read from ``file`` once.

    Use as a context manager: long records are kept as views of the map, valid
    until the block is closed. :attr:`records_read` counts the LMDB records read.
    """

    def __init__(
        self,
        file: RecordSet,
        layout: FixedLayout,
        samples: np.ndarray,
        *,
        verify: bool,
        reader: FixedWindowReader,
    ) -> None:
        self.file, self.layout = file, layout
        offsets = file.shard_offsets
        self._offsets = offsets
        records_per_shard = -(-np.diff(offsets) // layout.rows)
        self._base = np.concatenate(([0], np.cumsum(records_per_shard)))  # a record id over all shards
        self.keys = _unique(self._key_row(np.asarray(samples, np.int64))[0])  # sorted: block row j holds keys[j]
        self._walks = ShardWalks(file, [], verify=verify, buffers=True)
        self.records_read = 0
        self._closed = False
        try:
            cuts = np.searchsorted(self.keys, self._base).tolist()  # where each shard's records begin
            parts = []
            for s in range(len(offsets) - 1):
                ids = self.keys[cuts[s] : cuts[s + 1]] - self._base[s]
                if len(ids):
                    parts.append((self._walks.walk(s), self._walks.count(s), ids))
            self.window: FixedWindow = reader.read_records(parts)
        except BaseException:
            self.close()
            raise

    def _key_row(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record id over all shards, row inside that record) of each sample."""
        k, offsets = self.layout.rows, self._offsets
        if len(offsets) == 2:  # one file
            return samples // k, samples % k
        shard = np.searchsorted(offsets, samples, side="right") - 1
        local = samples - offsets[shard]
        return self._base[shard] + local // k, local % k

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of its record in the block, row inside that record) of each sample."""
        key, row = self._key_row(samples)
        return np.searchsorted(self.keys, key), row

    def columns(self, samples: np.ndarray) -> list[np.ndarray]:
        """Typed columns [len(samples), ...], one per field: the samples' values, zeros where a sample is -1."""
        return self.columns_many(samples[None])[0]

    def columns_many(self, samples: np.ndarray) -> list[list[np.ndarray]]:
        """:meth:`columns` of each row of ``samples`` [batches, n], located in the block all at once."""
        layout = self.layout
        batches, n = samples.shape
        valid = samples >= 0
        held = valid.sum(axis=1)
        if held.any():
            any_valid = samples[valid][0]
            rec, row = self.locate(np.where(valid, samples, any_valid))  # padding: a real sample, zeroed below
        shapes = [(n, *(int(d or 0) for d in f.shape)) for f in layout.fields]
        dtypes = [_dtypes.by_name(f.dtype).numpy for f in layout.fields]
        out: list[list[np.ndarray]] = []
        for i in range(batches):
            if not held[i]:
                raw = [np.zeros((n, size), np.uint8) for size in layout.sample_bytes]
            elif self.window.views is None:  # one fancy gather per field, straight into the result
                raw = [self.window.take(f, rec[i], row[i]) for f in range(len(layout.fields))]
                if held[i] < n:
                    for a in raw:
                        a[~valid[i]] = 0
            else:  # long records, kept as views of the map: each sample copied once, then placed
                raw = self.window.gather(rec[i][valid[i]], row[i][valid[i]])
                if held[i] < n:
                    placed = []
                    for a, size in zip(raw, layout.sample_bytes):
                        full = np.zeros((n, size), np.uint8)
                        full[valid[i]] = a
                        placed.append(full)
                    raw = placed
            typed = [a.view(dt).reshape(shape) for a, dt, shape in zip(raw, dtypes, shapes)]
            check_bools(typed, layout.fields, self.file.path)
            out.append(typed)
        return out

    def close(self) -> None:
        """End the read (views into the map become invalid); closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self.records_read = self._walks.close()

    def __enter__(self) -> RecordBlock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values: a presence table when they span a short range, else a sort."""
    if not len(values):
        return np.zeros(0, np.int64)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo <= 8 * len(values):
        seen = np.zeros(hi - lo + 1, bool)
        seen[values - lo] = True
        return np.flatnonzero(seen) + lo
    ordered = np.sort(values)  # np.unique would import numpy.ma (about 22 ms) in a fresh process
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]]
