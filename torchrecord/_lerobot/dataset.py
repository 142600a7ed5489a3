"""LeRobot's ``LeRobotDataset`` as a map-style drop-in over a set written by ``torchrecord.convert.from_lerobot``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from torchrecord._core.kinds import Place, Room
from torchrecord._lerobot.episodes import LeRobotSet
from torchrecord._lerobot.frames import Frames, runs_of
from torchrecord._order import delta_plan
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc, parse_check
from torchrecord.errors import ArgumentError, ArgumentTypeError, IndexOutOfRangeError

__all__ = ["LeRobotDataset", "LeRobotMeta"]


@dataclass(frozen=True)
class LeRobotMeta:
    """What LeRobot's ``LeRobotDatasetMetadata`` says of the dataset, as the conversion kept it.

    Attributes:
        fps: frames per second.
        features: the ``features`` of ``info.json``.
        info: the whole ``info.json``.
        stats: ``stats.json`` (None if the dataset had none).
        tasks: the task strings, by task index.
        episodes: the episode table (``episode_index``, ``length``, ``dataset_from_index``, ...), column by column.
        camera_keys, video_keys, image_keys: the cameras, those stored as video, those stored as images.
        total_episodes, total_frames: of the whole dataset.
    """

    fps: float
    features: Mapping[str, Any]
    info: Mapping[str, Any]
    stats: Mapping[str, Any] | None
    tasks: tuple[str, ...]
    episodes: Mapping[str, Any]
    camera_keys: tuple[str, ...]
    video_keys: tuple[str, ...]
    image_keys: tuple[str, ...]
    total_episodes: int
    total_frames: int


class LeRobotDataset(Dataset[dict[str, Any]]):
    """LeRobot's ``LeRobotDataset`` over a set written by ``torchrecord.convert.from_lerobot``.

    A drop-in replacement: the same ``len()`` and, for every index, the same
    item as ``LeRobotDataset`` (``lerobot-dataset`` 0.4, format v3.0) on the
    source dataset: the same keys in the same order, the same dtypes, shapes
    and values (``torch.equal``). Cameras are float32 ``[C, H, W]`` in [0, 1];
    the other features float32, int64 or bool tensors as LeRobot makes them
    (scalars 0-d); ``timestamp``, ``frame_index``, ``episode_index``,
    ``index``, ``task_index`` 0-d tensors; ``task`` the task string. With
    ``delta_timestamps`` each key listed is stacked to ``[T, ...]`` and gets a
    bool ``<key>_is_pad``; a query outside the item's episode repeats the
    episode's first or last frame.

    The columns other than cameras are held in memory (selected episodes only,
    copied once per process: a fork worker shares the parent's); camera
    frames are read from the set. A DataLoader calls ``__getitems__`` once per
    batch: every frame the batch needs is then read once, together.

    Args:
        path: a converted set (a path, or a :class:`~torchrecord.RecordSet`).
        delta_timestamps: ``{key: [seconds, ...]}``, as LeRobot's (each a
            multiple of ``1 / fps`` within ``tolerance_s``).
        episodes: the episode indices to read (stored order is kept); None: all.
        image_transforms: called on each camera tensor of an item, as LeRobot does.
        tolerance_s: LeRobot's tolerance: for ``delta_timestamps``, and for video
            frames (the decoded frame's time against the frame's timestamp,
            checked at conversion: a smaller tolerance than the set was checked
            with is refused here, where LeRobot fails on an item).
        check: integrity on read: ``"checksums"`` checks each record's CRC-32 as it
            is read, ``"structure"`` the file's LMDB page structure when the
            dataset is made, ``"full"`` both.

    Raises:
        ArgumentError: a delta that is not a multiple of ``1 / fps`` (a
            ValueError, as LeRobot's), a ``delta_timestamps`` key that is no
            feature (LeRobot fails on the first item), an episode the set lacks.
    """

    def __init__(
        self,
        path: SetLike,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | None = None,
        image_transforms: Callable[[torch.Tensor], Any] | None = None,
        tolerance_s: float = 1e-4,
        check: Check | None = None,
    ) -> None:
        check = parse_check(check)
        file = open_set(path, check=check)
        robot = LeRobotSet.open(file)
        self.path, self.robot = file.path, robot
        self.image_transforms, self.tolerance_s = image_transforms, tolerance_s
        for key, offset in robot.max_video_offset.items():
            if not np.float32(offset) < np.float32(tolerance_s):
                raise ArgumentError(
                    f"{self.path}: video key {key!r} has frames {offset:.3g} s away from their timestamps, "
                    f"beyond tolerance_s={tolerance_s} (LeRobot fails on such items); raise tolerance_s"
                )
        chosen = robot.positions(episodes)
        self.episodes = None if episodes is None else [int(e) for e in robot.episode_index[chosen]]
        starts, ends = robot.start[chosen], robot.end[chosen]
        lengths = ends - starts
        self._frame = np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist())])
        self._start, self._end = np.repeat(starts, lengths), np.repeat(ends, lengths)
        self._deltas = self._plan(robot, delta_timestamps)
        self.delta_timestamps = None if delta_timestamps is None else {k: list(v) for k, v in delta_timestamps.items()}
        plain = [c for c in robot.columns if c not in robot.cameras]
        cameras = [c for c in (*robot.video_keys, *robot.columns) if c in robot.cameras]
        self._keys = [*robot.video_keys, *robot.columns]
        self._order = [*self._keys, *(f"{k}_is_pad" for k in self._deltas), "task"]
        self.frames = Frames(file, plain, cameras, runs_of(starts, ends), verify=checks_crc(check))
        file.close()
        self.frames.fill()  # in this process: fork workers share it

    def _plan(self, robot: LeRobotSet, delta_timestamps: Mapping[str, Sequence[float]] | None) -> dict[str, np.ndarray]:
        if delta_timestamps is None:
            return {}
        if not isinstance(delta_timestamps, Mapping):
            raise ArgumentTypeError(
                f"delta_timestamps must be a dict of key -> [seconds, ...], got {delta_timestamps!r}"
            )
        keys = (*robot.video_keys, *robot.columns)
        for key in delta_timestamps:
            if key not in keys:
                raise ArgumentError(
                    f"{self.path}: delta_timestamps names {key!r}, which is no feature (its keys: {keys})"
                )
        fps = int(robot.fps) if robot.fps.is_integer() else robot.fps
        delta_plan.check_delta_timestamps(delta_timestamps, fps, self.tolerance_s)
        deltas = delta_plan.delta_indices(delta_timestamps, fps)
        for key in ("task_index", "timestamp"):
            if len(deltas.get(key, ())) > 1 and (key == "task_index" or robot.video_keys):
                raise ArgumentError(
                    f"delta_timestamps[{key!r}] with several offsets: LeRobot fails on every item (it reads one "
                    f"{key} per item{' of a set with videos' if key == 'timestamp' else ''})"
                )
        return deltas

    # -- LeRobot's attributes ---------------------------------------------------------------
    @property
    def fps(self) -> float:
        """Frames per second (an int when the dataset's is)."""
        fps = self.robot.fps
        return int(fps) if fps.is_integer() else fps

    @property
    def delta_indices(self) -> dict[str, list[int]] | None:
        """The frame offsets of ``delta_timestamps`` (None without)."""
        return {k: v.tolist() for k, v in self._deltas.items()} if self.delta_timestamps is not None else None

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes (= ``len()``)."""
        return len(self._frame)

    @property
    def num_episodes(self) -> int:
        """Episodes selected."""
        return len(self.episodes) if self.episodes is not None else len(self.robot.episode_index)

    @property
    def features(self) -> dict[str, Any]:
        """The ``features`` of ``info.json``."""
        return dict(self.meta.features)

    @property
    def meta(self) -> LeRobotMeta:
        """The dataset's metadata (fps, features, stats, tasks, episode table...)."""
        d, robot = self.robot.description, self.robot
        info = d.get("info") or {}
        cameras = tuple(k for k in info.get("features", {}) if k in robot.cameras)
        return LeRobotMeta(
            fps=self.fps,
            features=info.get("features", {}),
            info=info,
            stats=d.get("stats"),
            tasks=robot.tasks,
            episodes=d["episodes"],
            camera_keys=cameras,
            video_keys=robot.video_keys,
            image_keys=tuple(k for k in cameras if k not in robot.video_keys),
            total_episodes=len(robot.episode_index),
            total_frames=robot.total_frames,
        )

    @property
    def records_read(self) -> int:
        """Records this process read from the set (the columns' copy included)."""
        return self.frames.records_read

    # -- items ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._frame)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """The item at ``index`` (negative counts from the end)."""
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The items at ``indices``, every frame they need read once (a DataLoader calls this per batch)."""
        where, pads = self._queries(self._positions(indices))
        return self.split(*self._columns(where, pads))

    def _queries(self, at: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """Where each key of the items at positions ``at`` reads (global frames, ``[n]`` or ``[n, T]``), and the
        ``<key>_is_pad`` masks of the keys with ``delta_timestamps``."""
        frame, start, end = self._frame[at], self._start[at], self._end[at]
        # LeRobot decodes a video key without offsets at the item's timestamp, windowed when that is (one offset)
        shown = frame
        if "timestamp" in self._deltas:
            shown = delta_plan.query_frames(frame, start, end, self._deltas["timestamp"])[0][:, 0]
        where: dict[str, np.ndarray] = {}
        pads: dict[str, torch.Tensor] = {}
        for key in self._keys:
            where[key] = shown if key in self.robot.video_keys else frame
            if key in self._deltas:
                where[key], pad = delta_plan.query_frames(frame, start, end, self._deltas[key])
                pads[f"{key}_is_pad"] = torch.from_numpy(pad)
        return where, pads

    def read_cameras(self, where: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every camera frame ``where`` names, read once: per camera (its frames, sorted and unique; their pixels)."""
        unions = {key: np.unique(w) for key, w in where.items() if key in self.robot.cameras}
        pixels = self.frames.read_cameras(list(unions.items()))
        return {key: (frames, held) for (key, frames), held in zip(unions.items(), pixels)}

    def _columns(
        self,
        where: Mapping[str, np.ndarray],
        pads: Mapping[str, torch.Tensor],
        cameras: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
        room: Room | None = None,
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The items of ``where`` as columns ``[n, ...]`` in item order, and their task strings.

        ``cameras``: frames already read (:meth:`read_cameras`); else the frames are read here. ``room``: where
        to build the columns (a DataLoader worker's slot, ``torchrecord._read.ipc.slot_room``), so that the
        batch leaves the worker without another copy; None: fresh memory.
        """
        held = cameras if cameras is not None else self.read_cameras(where)
        columns: dict[str, torch.Tensor] = {}
        frames_of: dict[str, np.ndarray] = {}  # per camera: the uint8 frames [..., H, W, C] of its column
        for key in self._keys:
            w = where[key]
            if key in self.robot.cameras:
                frames, pixels = held[key]
                frames_of[key] = pixels[np.searchsorted(frames, w)]
            else:
                columns[key] = torch.from_numpy(self.frames.column(key, w))
        columns.update(pads)
        place = None
        if room is not None:
            sizes = [4 * int(np.prod(f.shape)) for f in frames_of.values()]  # float32
            place = room(sizes + [c.nbytes for c in columns.values()])
        for key, chosen in frames_of.items():
            squeeze = key in self.robot.video_keys and where[key].ndim == 2
            columns[key] = _scaled(chosen, squeeze=squeeze, place=place)
        if place is not None:
            for key, column in list(columns.items()):
                if key not in frames_of:
                    columns[key] = place(tuple(column.shape), column.dtype).copy_(column)
        tasks = self.robot.tasks
        names = [tasks[t] for t in columns["task_index"].reshape(-1).tolist()]
        return {key: columns[key] for key in self._order[:-1]}, names

    def split(self, columns: Mapping[str, torch.Tensor], names: Sequence[str]) -> list[dict[str, Any]]:
        """Columns ``[n, ...]`` (:meth:`_columns`) and their task ``names`` as ``n`` items, transforms applied."""
        keys = list(columns)
        items = [dict(zip(keys, values)) for values in zip(*(columns[key].unbind(0) for key in keys))]
        for item, name in zip(items, names):
            item["task"] = name
        if self.image_transforms is not None:
            for item in items:
                for key in self.robot.cameras:
                    item[key] = self.image_transforms(item[key])
        return items

    def _positions(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        if hasattr(indices, "detach"):
            indices = indices.detach().cpu().numpy()
        at = np.asarray(indices)
        if at.dtype == np.bool_ or (at.size and not np.issubdtype(at.dtype, np.integer)) or at.ndim != 1:
            raise ArgumentTypeError(f"{self.path}: item indices must be ints, got {indices!r}")
        at = at.astype(np.int64)
        n = len(self._frame)
        at = np.where(at < 0, at + n, at)
        bad = np.flatnonzero((at < 0) | (at >= n))
        if len(bad):
            raise IndexOutOfRangeError(
                f"item {int(np.asarray(indices)[bad[0]])} out of range for {self.path} with {n} frames"
            )
        return at

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset({self.path!r}, episodes={self.num_episodes}, frames={len(self)}, fps={self.fps}, "
            f"delta_timestamps={self.delta_timestamps!r})"
        )


def _scaled(pixels: np.ndarray, *, squeeze: bool, place: Place | None = None) -> torch.Tensor:
    """uint8 frames [..., H, W, C] as LeRobot's float32 [..., C, H, W] in [0, 1] (``uint8 / 255``).

    ``place``: where to write the result (a slot's room); the division then reads the frames channels-last
    and writes the channels-first result there in one pass.
    """
    channels_last = torch.from_numpy(pixels)
    if place is None:
        channels_first = channels_last.movedim(-1, -3).contiguous()  # the permuted copy in uint8
        out = torch.div(channels_first, 255)  # float32, value for value LeRobot's ``to(float32).div(255)``
    else:
        shape = (*pixels.shape[:-3], pixels.shape[-1], *pixels.shape[-3:-1])
        out = torch.div(channels_last.movedim(-1, -3), 255, out=place(shape, torch.float32))
    if squeeze and out.shape[1] == 1:  # LeRobot squeezes a video window of one frame
        out = out.squeeze(1)
    return out
