"""A record set converted from a LeRobot v3.0 dataset: what it holds, read back from its metadata.

``torchrecord.convert.from_lerobot`` writes one sample per frame, in LeRobot's
global frame order (sample ``i`` is the frame whose ``index`` is ``i``),
episode after episode; a single-file set is grouped by ``episode_index``::

    {<feature key>: value, ...}     # every column of LeRobot's data tables, in its order,
                                    # with each camera (image or video) as uint8 [H, W, C]

Scalar columns are 0-d, the others keep their shape and dtype; camera frames
hold the pixels LeRobot gives before it scales them to float (an image's
decoded PNG; a video frame decoded as LeRobot decodes it). The user metadata
``"lerobot"`` map (:data:`META_KEY`, description :data:`VERSION`) keeps the
rest of the dataset: ``fps``, ``info.json``, ``stats.json``, the tasks, the
episode table and, per video key, how its frames were decoded.
:class:`LeRobotSet` reads and checks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, FormatError, VersionError

__all__ = ["EPISODE_FIELD", "LeRobotSet", "META_KEY", "VERSION", "item_dtype"]

#: The user metadata key of the description.
META_KEY = "lerobot"
#: Version of the description (bumped when readers must change).
VERSION = 1
#: The per-frame field a single-file set is grouped by.
EPISODE_FIELD = "episode_index"


def item_dtype(stored: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype LeRobot's items give a stored column: float32 for floats, int64 for integers, bool for bools.

    LeRobot reads rows as Python values and makes each one ``torch.tensor(value)``.
    """
    if stored.kind == "b":
        return np.dtype(np.bool_)
    if stored.kind in "iu":
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@dataclass(frozen=True)
class LeRobotSet:
    """The description of a converted LeRobot set, checked against the set it came with.

    Attributes:
        path: the set.
        fps: frames per second.
        columns: the item keys of the data table, in LeRobot's order (cameras stored as images included).
        video_keys: the cameras LeRobot decodes from video, in feature order.
        cameras: every camera (image or video).
        tasks: the task strings by position (LeRobot's ``tasks.iloc[task_index]``).
        episode_index, start, end: the episode table: each episode's index and its frames ``[start, end)``.
        max_video_offset: per video key, the largest gap in seconds between a frame's
            timestamp and the decoded frame's, found at conversion.
        description: the whole metadata map (``info``, ``stats``...).
    """

    path: str
    fps: float
    columns: tuple[str, ...]
    video_keys: tuple[str, ...]
    cameras: frozenset[str]
    tasks: tuple[str, ...]
    episode_index: np.ndarray
    start: np.ndarray
    end: np.ndarray
    max_video_offset: Mapping[str, float]
    description: Mapping[str, Any]

    @classmethod
    def open(cls, file: RecordSet) -> LeRobotSet:
        """Read and check the description of ``file``; FormatError if it is not a converted LeRobot set."""
        path = file.path
        meta = file.user_metadata.get(META_KEY)
        if not isinstance(meta, dict):
            raise FormatError(
                f"{path}: not converted from a LeRobot dataset (no {META_KEY!r} user metadata); convert one with "
                "torchrecord.convert.from_lerobot"
            )
        version = meta.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise VersionError(
                f"{path}: its LeRobot description has version {version!r}; this torchrecord reads version {VERSION} "
                "and older: upgrade torchrecord"
            )
        try:
            episodes = meta["episodes"]
            start = np.asarray(episodes["dataset_from_index"], dtype=np.int64)
            end = np.asarray(episodes["dataset_to_index"], dtype=np.int64)
            out = cls(
                path=path,
                fps=float(meta["fps"]),
                columns=tuple(str(c) for c in meta["columns"]),
                video_keys=tuple(str(k) for k in meta["video_keys"]),
                cameras=frozenset(str(k) for k in meta["cameras"]),
                tasks=tuple(str(t) for t in meta["tasks"]),
                episode_index=np.asarray(episodes["episode_index"], dtype=np.int64),
                start=start,
                end=end,
                max_video_offset={str(k): float(v["max_offset_s"]) for k, v in meta["video"].items()},
                description=meta,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"{path}: its {META_KEY!r} description is damaged ({type(exc).__name__}: {exc})"
            ) from None
        out._check(file)
        return out

    def _check(self, file: RecordSet) -> None:
        n = len(file)
        names = set(file.schema.names)
        missing = [c for c in (*self.columns, *self.video_keys) if c not in names]
        if missing:
            raise FormatError(f"{self.path}: its LeRobot description names fields the set lacks: {missing}")
        e = len(self.episode_index)
        if not (len(self.start) == len(self.end) == e) or not e:
            raise FormatError(f"{self.path}: its LeRobot episode table is empty or of uneven columns")
        bounds = np.concatenate((self.start, self.end[-1:]))
        if self.start[0] != 0 or not np.array_equal(self.start[1:], self.end[:-1]) or (np.diff(bounds) < 1).any():
            raise FormatError(f"{self.path}: its LeRobot episode table does not cover its frames episode after episode")
        if int(self.end[-1]) != n:
            raise FormatError(f"{self.path}: its LeRobot episode table holds {int(self.end[-1])} frames, the set {n}")

    @property
    def total_frames(self) -> int:
        return int(self.end[-1])

    def positions(self, episodes: Sequence[int] | None) -> np.ndarray:
        """Which episodes (positions in the table, in stored order) ``episodes`` selects; all for None.

        LeRobot keeps the stored order whatever order the list gives, and each
        episode once. ArgumentError (a ValueError) for an episode the set lacks.
        """
        if episodes is None:
            return np.arange(len(self.episode_index), dtype=np.int64)
        wanted = np.asarray(list(episodes))
        if wanted.dtype == np.bool_ or (len(wanted) and not np.issubdtype(wanted.dtype, np.integer)):
            raise ArgumentError(f"episodes must be a list of episode indices (ints), got {episodes!r}")
        unknown = sorted(set(wanted.tolist()) - set(self.episode_index.tolist()))
        if unknown:
            raise ArgumentError(
                f"{self.path}: has no episode {unknown[0]} (its episodes: {_span(self.episode_index)}); "
                "choose episodes it holds"
            )
        return np.flatnonzero(np.isin(self.episode_index, wanted))


def _span(values: np.ndarray) -> str:
    if len(values) and np.array_equal(values, np.arange(values[0], values[0] + len(values))):
        return f"{int(values[0])} .. {int(values[-1])}"
    return ", ".join(str(v) for v in values[:10].tolist()) + (", ..." if len(values) > 10 else "")
