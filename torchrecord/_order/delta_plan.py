"""LeRobot's ``delta_timestamps`` windows as pure functions of the episode bounds.

LeRobot's ``LeRobotDataset(delta_timestamps={key: [seconds, ...]})`` turns each
offset into a frame offset ``round(seconds * fps)`` after checking that every
offset is a multiple of ``1 / fps`` within ``tolerance_s``. An item at global
frame ``a`` of an episode ``[start, end)`` then reads, per key, frames
``clip(a + d, start, end - 1)`` (a query outside the episode repeats its first
or last frame, never a neighbour's) and ``<key>_is_pad`` is True where
``a + d`` fell outside. These functions compute exactly that, for many items
at once, with no file open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pprint import pformat

import numpy as np

from torchrecord.errors import ArgumentError

__all__ = ["check_delta_timestamps", "delta_indices", "query_frames"]


def check_delta_timestamps(delta_timestamps: Mapping[str, Sequence[float]], fps: float, tolerance_s: float) -> None:
    """ArgumentError (a ValueError) naming every offset that is not a multiple of ``1 / fps`` within ``tolerance_s``.

    The rule is LeRobot's: ``abs(ts * fps - round(ts * fps)) / fps <= tolerance_s``.
    """
    outside: dict[str, list[float]] = {}
    for key, offsets in delta_timestamps.items():
        bad = [ts for ts in offsets if not abs(ts * fps - round(ts * fps)) / fps <= tolerance_s]
        if bad:
            outside[key] = bad
    if outside:
        raise ArgumentError(
            f"these delta_timestamps are not multiples of 1/{fps} s within tolerance_s={tolerance_s}: "
            f"{pformat(outside)}; make them multiples of 1/{fps} (or raise tolerance_s)"
        )


def delta_indices(delta_timestamps: Mapping[str, Sequence[float]], fps: float) -> dict[str, np.ndarray]:
    """Frame offsets per key: ``round(seconds * fps)`` (Python's rounding, as LeRobot's), int64 arrays."""
    out: dict[str, np.ndarray] = {}
    for key, offsets in delta_timestamps.items():
        if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Sequence) or not len(offsets):
            raise ArgumentError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, got {offsets!r}")
        out[key] = np.array([round(float(d) * fps) for d in offsets], dtype=np.int64)
    return out


def query_frames(
    frames: np.ndarray, start: np.ndarray, end: np.ndarray, deltas: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The frames read and the pad mask for items at global ``frames`` (their episodes ``[start, end)``).

    Args:
        frames: int64 [B]: each item's global frame index.
        start, end: int64 [B]: the bounds of each item's episode.
        deltas: int64 [T]: the key's frame offsets.

    Returns:
        (query [B, T] int64 clipped into each episode, is_pad [B, T] bool).
    """
    wanted = frames[:, None] + deltas[None, :]
    lo, hi = start[:, None], end[:, None]
    return np.clip(wanted, lo, hi - 1), (wanted < lo) | (wanted >= hi)
