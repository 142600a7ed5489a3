"""robomimic's sequence windows as pure functions of the demo lengths and the window parameters.

robomimic's ``SequenceDataset`` numbers windows demo after demo. Demo ``j`` of
length ``L`` gives ``L - (frame_stack - 1 unless pad_frame_stack) -
(seq_length - 1 unless pad_seq_length)`` windows (at least one when padding the
sequence). Window ``w`` of a demo is centred on frame ``i = w + (frame_stack - 1
unless pad_frame_stack)`` and covers frames ``i - frame_stack + 1 .. i +
seq_length - 1``; frames outside the demo repeat its first or last frame (the
pad mask is False there). The goal (``goal_mode="last"``) is the next_obs frame
``L - 1 - (seq_length - 1 unless pad_seq_length)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torchrecord.errors import ArgumentError

__all__ = ["WindowSpec", "Windows"]


@dataclass(frozen=True)
class WindowSpec:
    """The window parameters robomimic's SequenceDataset takes (checked as robomimic checks them)."""

    frame_stack: int = 1
    seq_length: int = 1
    pad_frame_stack: bool = True
    pad_seq_length: bool = True

    def __post_init__(self) -> None:
        for name in ("frame_stack", "seq_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ArgumentError(f"{name} must be an int >= 1, got {value!r}")

    @property
    def frames(self) -> int:
        """Frames per window: ``frame_stack - 1 + seq_length``."""
        return self.frame_stack - 1 + self.seq_length

    @property
    def head(self) -> int:
        """Frames a demo's first window skips (``frame_stack - 1`` without frame-stack padding)."""
        return 0 if self.pad_frame_stack else self.frame_stack - 1

    @property
    def tail(self) -> int:
        """Frames a demo's last window stops short of (``seq_length - 1`` without sequence padding)."""
        return 0 if self.pad_seq_length else self.seq_length - 1

    @property
    def min_length(self) -> int:
        """The shortest demo robomimic accepts with these parameters."""
        return self.head + self.tail + 1

    def counts(self, lengths: np.ndarray) -> np.ndarray:
        """Windows per demo."""
        return np.maximum(np.asarray(lengths, dtype=np.int64) - self.head - self.tail, 0)


class Windows:
    """The windows of a list of demos: numbering, frames and pad masks (no I/O).

    Args:
        spec: the window parameters.
        lengths: frames of each demo.
        names: demo names, for errors.
        where: the file, for errors.

    Raises:
        ValueError: a demo is shorter than ``spec.min_length`` (robomimic fails
            on such a demo too), naming the demo and the minimum.
    """

    def __init__(self, spec: WindowSpec, lengths: np.ndarray, names: Sequence[str], where: str = "") -> None:
        self.spec = spec
        self.lengths = np.asarray(lengths, dtype=np.int64)
        short = np.flatnonzero(self.lengths < spec.min_length)
        if len(short):
            j = int(short[0])
            prefix = f"{where}: " if where else ""
            raise ArgumentError(
                f"{prefix}demo {names[j]!r} has {int(self.lengths[j])} frames; with frame_stack={spec.frame_stack}, "
                f"seq_length={spec.seq_length}, pad_frame_stack={spec.pad_frame_stack} and pad_seq_length="
                f"{spec.pad_seq_length} every demo needs at least {spec.min_length} (robomimic fails on it too): "
                "pad, or leave the demo out with a filter"
            )
        self.counts = spec.counts(self.lengths)
        self.starts = np.concatenate(([0], np.cumsum(self.counts))).astype(np.int64)
        self.offsets = np.arange(-(spec.frame_stack - 1), spec.seq_length, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(demo position, centre frame) of each window index."""
        index = np.asarray(index, dtype=np.int64)
        demo = np.searchsorted(self.starts, index, side="right") - 1
        return demo, index - self.starts[demo] + self.spec.head

    def frames(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(demo [n], frame numbers [n, T] with padding repeated, pad mask [n, T]) of each window."""
        demo, centre = self.locate(index)
        raw = centre[:, None] + self.offsets[None, :]
        last = self.lengths[demo][:, None] - 1
        mask = (raw >= 0) & (raw <= last)
        return demo, np.clip(raw, 0, last), mask

    def goal_frame(self, demo: np.ndarray) -> np.ndarray:
        """The next_obs frame robomimic's ``goal_mode="last"`` gives for each demo position."""
        goal: np.ndarray = self.lengths[demo] - 1 - self.spec.tail
        return goal
