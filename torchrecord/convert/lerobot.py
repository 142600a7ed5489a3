"""LeRobot v3.0 datasets: one sample per frame, in LeRobot's frame order, episodes kept together.

A LeRobot dataset (format v3.0, as ``lerobot-dataset`` and ``lerobot`` write it)
is a folder: ``meta/info.json`` (fps, features), ``meta/tasks.parquet``,
``meta/episodes/*/*.parquet`` (the episode table), ``data/*/*.parquet`` (one row
per frame; images embedded as PNG) and ``videos/<camera>/*/*.mp4`` (many
episodes per file). :func:`from_lerobot` writes the layout described in
``torchrecord._lerobot.episodes``: frame ``i`` of the dataset is sample ``i``,
every column kept with its dtype and shape, each camera as uint8 ``[H, W, C]``:
an image's stored pixels; a video frame decoded (PyAV) exactly as LeRobot's
reader decodes it. fps, ``info.json``, ``stats.json``, the tasks and the
episode table go into the user metadata. Read it back with
:class:`torchrecord.LeRobotDataset`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._lerobot.episodes import EPISODE_FIELD, META_KEY, VERSION
from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import StoreOptions, WriteSettings, spell_out
from torchrecord.convert._common import Converter, Target, write
from torchrecord.convert._rows import RowStream
from torchrecord.convert.lerobot_source import LeRobotSource, find_lerobot, is_lerobot
from torchrecord.convert.lerobot_video import VideoFrames, VideoPlan, av_version
from torchrecord.errors import ArgumentError, SourceError

__all__ = ["LEROBOT", "NOT_LEROBOT", "find_lerobot", "from_lerobot", "is_lerobot"]


class _Video:
    """Where each frame of one video key comes from: its file and frame index, and the largest time gap."""

    def __init__(self, src: LeRobotSource, key: str) -> None:
        self.key = key
        ep = src.episodes
        plans: dict[str, VideoPlan] = {}
        self.files: list[str] = []
        self.index = np.zeros(int(ep["dataset_to_index"][-1]), np.int64)
        self.max_offset = 0.0
        times = np.concatenate([values["timestamp"] for _, values in src.rows(0, len(self.index), ["timestamp"])])
        column = f"videos/{key}/from_timestamp"
        if column not in ep:
            raise SourceError(f"{src.root}: the episode table has no {column!r} column for video key {key!r}")
        for e, (a, b) in enumerate(zip(ep["dataset_from_index"], ep["dataset_to_index"])):
            path = src.video_file(key, e)
            if path not in plans:
                if not os.path.exists(path):
                    raise SourceError(f"{path}: missing (the video of {key!r} for episode {e})")
                plans[path] = VideoPlan(path)
            # LeRobot's query: the episode's start in the file plus the frame's float32 timestamp, in float64
            queries = float(ep[column][e]) + times[a:b].astype(np.float64)
            self.index[a:b], gap = plans[path].indices(queries, f"episode {e}")
            self.max_offset = max(self.max_offset, gap)
            self.files.append(path)
        self.times = {path: plan.times for path, plan in plans.items()}


def _description(src: LeRobotSource, videos: dict[str, _Video]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "source": os.path.basename(os.path.normpath(src.root)),
        "codebase_version": src.info.get("codebase_version"),
        "fps": src.fps,
        "columns": src.columns,
        "video_keys": src.video_keys,
        "cameras": src.cameras,
        "tasks": src.tasks,
        "episodes": src.episodes,
        "info": src.info,
        "stats": src.stats,
        "video": {k: {"decoder": av_version(), "max_offset_s": v.max_offset} for k, v in videos.items()},
    }


def _samples(src: LeRobotSource, lo: int, hi: int, videos: dict[str, _Video]) -> Iterator[dict[str, Any]]:
    """The frames ``[lo, hi)`` as samples, checked against the episode table as they are read."""
    start = np.asarray(src.episodes["dataset_from_index"], np.int64)
    decoders = {key: VideoFrames() for key in videos}
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        for first, values in src.rows(lo, hi, src.columns):
            n = len(next(iter(values.values())))
            frames = np.arange(first, first + n)
            episode = np.searchsorted(start, frames, side="right") - 1
            _check_rows(src, values, frames, episode, start)
            for i in range(n):
                g = int(frames[i])
                sample: dict[str, Any] = {}
                for key, video in videos.items():
                    path, index = video.files[int(episode[i])], int(video.index[g])
                    pixels, time = decoders[key].frame(path, index)
                    if time != video.times[path][index]:
                        raise SourceError(f"{path}: frame {index} decodes at {time} s, its packet says otherwise")
                    sample[key] = pixels
                for key in src.columns:
                    sample[key] = values[key][i]
                for key in src.cameras:
                    shape = shapes.setdefault(key, sample[key].shape)
                    if sample[key].shape != shape:
                        raise SourceError(
                            f"{src.root}: frame {g}, camera {key!r} is {sample[key].shape}, earlier {shape}"
                        )
                yield sample
    finally:
        for decoder in decoders.values():
            decoder.close()


def _check_rows(
    src: LeRobotSource, values: dict[str, np.ndarray], frames: np.ndarray, episode: np.ndarray, start: np.ndarray
) -> None:
    """Each row's ``index``, ``episode_index`` and ``frame_index`` against its place in the episode table."""
    expected = {"index": frames, "episode_index": episode, "frame_index": frames - start[episode]}
    for name, want in expected.items():
        got = values.get(name)
        if got is None:
            raise SourceError(f"{src.root}: the data has no {name!r} column")
        bad = np.flatnonzero(got.reshape(len(frames)) != want)
        if len(bad):
            g = int(frames[bad[0]])
            raise SourceError(
                f"{src.at('data')}: frame {g} (row {g} in data file order) has {name}={got.reshape(-1)[bad[0]]}, "
                f"expected {int(want[bad[0]])} from the episode table; the rows must be in LeRobot's frame order"
            )


@spell_out(StoreOptions)
def from_lerobot(
    source: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    shard: int | None = None,
    num_shards: int | None = None,
    **options: Unpack[StoreOptions],
) -> RecordFile:
    """Convert a LeRobot v3.0 dataset into a record set, one sample per frame, in LeRobot's frame order.

    Every column of the data tables is kept (scalars 0-d, the rest with their
    shape and dtype) and every camera is stored as uint8 ``[H, W, C]``: an
    image's stored pixels, a video frame decoded with PyAV exactly as LeRobot's
    reader decodes it (the frame it picks for each timestamp, in RGB24). The
    frames are checked against the episode table as they are read (``index``,
    ``episode_index``, ``frame_index``). fps, ``info.json``, ``stats.json``, the
    tasks and the episode table go into the user metadata
    (``RecordFile(path).user_metadata["lerobot"]``). Read the set with
    :class:`torchrecord.LeRobotDataset`. Nothing is downloaded.

    Args:
        source: the dataset's folder, or a repo id (``org/name``) already in the
            local Hugging Face cache (see :func:`find_lerobot`).
        path: the record set to write (a folder with ``num_shards``).
        shard, num_shards: write shard ``shard`` of ``num_shards`` of a sharded
            set in the folder ``path``: the shards hold consecutive whole
            episodes (shard ``i`` episodes ``[i*E//n, (i+1)*E//n)``), each
            written by its own call (e.g. one process each), and the last to
            finish publishes the set (see :func:`torchrecord.write_shard`).
            A single file is grouped by episode (``group_by``); a sharded set
            has no groups (the episode table gives the episodes).
        **options: the write options of how a set is stored
            (:class:`~torchrecord.StoreOptions`: ``overwrite``, ``metadata``,
            stored beside ``"lerobot"``, ``compression``...).
            ``samples_per_record`` defaults to 1 with ``compression`` (a frame
            read at random then decompresses only itself);
            ``compression={"observation.images.top": "zstd"}`` compresses a
            camera (the ``compress`` extra; see docs/lerobot.md for sizes and
            speeds).

    The other options of :func:`torchrecord.write_record` do not apply: the set
    keeps LeRobot's frame order (``shuffle``, ``seed``), is grouped by episode
    (``group_by``), reads the dataset in this process (``num_workers``,
    ``multiprocessing_context``), stops at the first bad frame (``on_error``,
    ``max_skipped``) and builds its own schema (``schema``).

    Raises:
        SourceError: not a LeRobot v3.0 folder, a repo id not in the local cache,
            a missing or unreadable file, rows out of LeRobot's frame order, a
            null value, a string feature, an image that is not 8-bit, a video
            without the frame a timestamp asks for (each naming the file, frame
            and column).
        MissingDependencyError: pyarrow (or, for videos, PyAV; for images,
            Pillow) is not installed: the ``lerobot`` extra installs them.
    """
    settings = WriteSettings.of(options, "from_lerobot", StoreOptions)
    src = LeRobotSource(find_lerobot(source))
    episodes = len(src.episodes["episode_index"])
    lo, hi = 0, int(src.episodes["dataset_to_index"][-1])
    if num_shards is not None or shard is not None:
        if num_shards is None or shard is None or not 0 <= shard < num_shards:
            raise ArgumentError(
                f"give shard in [0, num_shards) and num_shards together, got {shard!r} of {num_shards!r}"
            )
        if num_shards > episodes:
            raise ArgumentError(f"num_shards={num_shards} is more than the dataset's {episodes} episodes")
        first, last = shard * episodes // num_shards, (shard + 1) * episodes // num_shards
        lo, hi = int(src.episodes["dataset_from_index"][first]), int(src.episodes["dataset_to_index"][last - 1])
    # every episode's frames are planned (packets only, no decoding), also by a shard's writer: the largest
    # time gap in the metadata is the whole dataset's, the same in every shard
    videos = {key: _Video(src, key) for key in src.video_keys}
    description = _description(src, videos)
    stream = RowStream(hi - lo, lambda: _samples(src, lo, hi, videos))
    grouped = EPISODE_FIELD if num_shards is None else None
    # compressed: one frame per record, so that reading a frame at random decompresses that frame only
    packing = settings.samples_per_record
    if settings.compression is not None and packing is None:
        packing = 1
    settings = dataclasses.replace(settings, shuffle=False, group_by=grouped, samples_per_record=packing)
    target = Target(path, settings, shard, num_shards)
    return write(stream, target, {"source_format": "lerobot", META_KEY: description})


#: write_record's options that do not apply to a LeRobot source (see :func:`from_lerobot`), and why.
NOT_LEROBOT = {
    "seed": "the set keeps LeRobot's frame order",
    "num_workers": "the dataset is read in this process, in frame order",
    "multiprocessing_context": "the dataset is read in this process, in frame order",
    "on_error": "a bad frame stops the conversion",
    "max_skipped": "a bad frame stops the conversion",
    "group_by": "the set is grouped by episode",
    "schema": "the converter builds the schema from the dataset",
}


LEROBOT = Converter(
    "lerobot",
    from_lerobot,
    "a LeRobot v3.0 dataset folder (or, with --format lerobot, a repo id in the local Hugging Face cache): "
    "one sample per frame in LeRobot's order, cameras as uint8 [H, W, C] (videos decoded), for "
    "torchrecord.LeRobotDataset",
    lambda probe: probe.is_dir and is_lerobot(probe.path),
    rank=5,  # before hf: a LeRobot folder holds parquet files too
    refused={**NOT_LEROBOT, "shuffle": "the set keeps LeRobot's frame order"},
    defaults={"shuffle": False},
)
