"""Frames of a converted LeRobot set by global frame index: small columns held in memory, cameras read per batch.

:class:`Frames` answers the drop-in's two questions for arrays of frame indices
(any shape, repeats allowed: padding repeats an episode's edge frames and
neighbouring items share frames):

* the small columns (everything but the cameras): copied once per process,
  for the selected episodes only, into one contiguous array per column,
  already in the dtype of LeRobot's items, with a frame -> row table; an item's
  window is then one fancy index per column. The copy reads only these fields'
  bytes (``ShareReader`` with ``out=``), not the camera payloads around them;
* the cameras: the union of the records a batch needs, each read once by key
  (``RecordBlock``), each frame's bytes copied once, straight into [frames, ...]
  uint8 arrays.

The reader never opens LMDB itself; it pickles without its columns (a spawn
worker fills its own, a fork worker shares the parent's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.layout import FixedLayout
from torchrecord._lerobot.episodes import item_dtype
from torchrecord._order.share import Share
from torchrecord._read.reader import ShareReader
from torchrecord._read.record_block import RecordBlock
from torchrecord._store.fastread import FixedWindowReader
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import FormatError

__all__ = ["Frames", "runs_of"]

#: Frames read per step while filling the columns.
_FILL_FRAMES = 1 << 16


class Frames:
    """Fields of a converted LeRobot set at global frame indices.

    Args:
        file: the record set (a fixed layout: every field numeric with one shape).
        columns: the fields held in memory (cast to their item dtype).
        cameras: the fields read from the file per request (uint8 frames).
        episodes: ``[start, end)`` of each selected episode: the frames held.
        verify: check each record's CRC-32 as it is read.
    """

    def __init__(
        self,
        file: RecordSet,
        columns: Sequence[str],
        cameras: Sequence[str],
        episodes: Sequence[tuple[int, int]],
        *,
        verify: bool,
    ) -> None:
        self.file, self.verify = file, verify
        self.columns, self.cameras = tuple(columns), tuple(cameras)
        self.runs = tuple((int(a), int(b)) for a, b in episodes)
        self.index = {f.name: i for i, f in enumerate(file.schema.fields)}
        layout = FixedLayout.of_file(file)
        if layout is None:
            raise FormatError(f"{file.path}: its fields do not all have one shape; convert the LeRobot dataset again")
        self.layout = layout
        self._held: dict[str, np.ndarray] | None = None
        self._row_of: np.ndarray | None = None
        self._reader: FixedWindowReader | None = None
        self.records_read = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None, "_row_of": None, "_reader": None, "records_read": 0}

    # -- shapes --------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d or 0) for d in self.file.schema.fields[self.index[name]].shape)

    def stored_dtype(self, name: str) -> np.dtype[Any]:
        return np.dtype(_dtypes.by_name(self.file.schema.fields[self.index[name]].dtype).numpy)

    # -- the columns held in memory ------------------------------------------------------------
    def fill(self) -> None:
        """Copy the columns of the selected frames into memory in this process (once)."""
        if self._held is not None:
            return
        n = sum(b - a for a, b in self.runs)
        raw: list[np.ndarray | None] = [None] * len(self.layout.fields)
        for name in self.columns:
            raw[self.index[name]] = np.empty((n, self.layout.sample_bytes[self.index[name]]), np.uint8)
        if self.columns and n:
            share = dataclasses.replace(Share.in_order(self.runs), window=min(n, _FILL_FRAMES))
            reader = ShareReader(self.file, share, layout=self.layout, verify=self.verify, advise=False)
            try:
                for _ in reader.indexed_chunks(min(n, _FILL_FRAMES), 0, out=raw):
                    pass
            finally:
                self.records_read += reader.records_read
        held = {}
        for name in self.columns:
            column = raw[self.index[name]]
            assert column is not None
            typed = column.view(self.stored_dtype(name)).reshape(n, *self.shape(name))
            held[name] = typed.astype(item_dtype(typed.dtype), copy=False)
        row_of = np.full(len(self.file), -1, np.int64)
        at = 0
        for a, b in self.runs:
            row_of[a:b] = np.arange(at, at + b - a)
            at += b - a
        self._held, self._row_of = held, row_of

    def column(self, name: str, frames: np.ndarray) -> np.ndarray:
        """Column ``name`` at ``frames`` (global indices of held frames): shape ``frames.shape + item shape``."""
        self.fill()
        assert self._held is not None and self._row_of is not None
        out: np.ndarray = self._held[name][self._row_of[frames]]
        return out

    # -- cameras from the file --------------------------------------------------------------------
    def read_cameras(self, wanted: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """Each camera ``name`` at its ``frames`` (any shape): uint8 arrays ``frames.shape + frame shape``.

        The records holding all of them are read once, together.
        """
        if not wanted:
            return []
        flat = [np.ascontiguousarray(frames, dtype=np.int64).reshape(-1) for _, frames in wanted]
        layout = self.layout
        if self._reader is None:
            self._reader = FixedWindowReader(layout, 256)
        with RecordBlock(self.file, layout, np.concatenate(flat), verify=self.verify, reader=self._reader) as block:
            outs = []
            for (name, frames), where in zip(wanted, flat):
                f = self.index[name]
                dst: list[np.ndarray | None] = [None] * len(layout.fields)
                dst[f] = out = np.empty((len(where), layout.sample_bytes[f]), np.uint8)
                if len(where):
                    rec, row = block.locate(where)
                    block.window.gather(rec, row, dst)
                outs.append(out.reshape(*frames.shape, *self.shape(name)))
        self.records_read += block.records_read
        return outs


def runs_of(start: np.ndarray, end: np.ndarray) -> list[tuple[int, int]]:
    """Episodes ``[start, end)`` merged where one ends where the next starts."""
    runs: list[tuple[int, int]] = []
    for a, b in zip(start.tolist(), end.tolist()):
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    return runs
