"""LeRobot's video frames, decoded at conversion exactly as LeRobot decodes them (with PyAV).

LeRobot (format v3.0) keeps each camera as MP4 files holding many episodes one
after another. For the frame of an episode at ``timestamp``, its reader asks
the decoder (torchcodec) for frame ``round((from_timestamp + timestamp) *
average_fps)`` of the file, where ``from_timestamp`` is the episode's start in
the file and ``average_fps`` the stream's average rate, and fails unless the
frame's time is within ``tolerance_s`` of the query (compared in float32).
The pixels are the frame converted to RGB24. :class:`VideoPlan` finds each
frame's index and how far its time is from the query by reading the packets
only; :class:`VideoFrames` then decodes the files once, forwards, and hands out
the frames by index.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from torchrecord._core.extras import LEROBOT_HINT
from torchrecord.errors import MissingDependencyError, SourceError

__all__ = ["VideoFrames", "VideoPlan", "av_version", "need"]


def need(module: str, purpose: str) -> Any:
    """Import a dependency of the ``lerobot`` extra, or raise MissingDependencyError saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"{purpose} needs {module.split('.')[0]}: {LEROBOT_HINT}") from exc


def _av() -> Any:
    return need("av", "decoding a LeRobot dataset's videos")


def av_version() -> str:
    """``PyAV <version>``, as the set's metadata records the decoder."""
    return f"PyAV {_av().__version__}"


class VideoPlan:
    """One video file's frame times (from its packets, in presentation order) and average rate."""

    def __init__(self, path: str) -> None:
        av = _av()
        self.path = path
        try:
            with av.open(path) as container:
                stream = container.streams.video[0]
                rate = stream.average_rate
                base = stream.time_base
                pts = sorted(p.pts for p in container.demux(stream) if p.pts is not None)
        except (OSError, IndexError, av.error.FFmpegError) as exc:
            raise SourceError(f"{path}: cannot read as a video ({exc})") from None
        if rate is None or not pts:
            raise SourceError(f"{path}: has no video frames or no average frame rate")
        self.average_fps = float(rate)
        self.times = np.array([float(p * base) for p in pts], dtype=np.float64)

    def indices(self, queries: np.ndarray, where: str) -> tuple[np.ndarray, float]:
        """The frame index of each query time (LeRobot's rounding) and the largest gap to its frame's time."""
        index = np.array([round(q * self.average_fps) for q in queries.tolist()], dtype=np.int64)
        bad = np.flatnonzero((index < 0) | (index >= len(self.times)))
        if len(bad):
            raise SourceError(
                f"{self.path}: {where}: the frame at {queries[bad[0]]:.6f} s (frame {int(index[bad[0]])}) is past the "
                f"video's {len(self.times)} frames"
            )
        gap = np.abs(queries.astype(np.float32) - self.times[index].astype(np.float32))
        return index, float(gap.max()) if len(gap) else 0.0


class VideoFrames:
    """Frames of one camera's video files by (file, index), decoded forwards, each file once when asked in order."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._frames: Iterator[Any] | None = None
        self._container: Any = None
        self._next = 0
        self._last: tuple[int, np.ndarray, float] | None = None

    def frame(self, path: str, index: int) -> tuple[np.ndarray, float]:
        """Frame ``index`` of ``path`` as uint8 [H, W, 3] RGB, and its time in seconds."""
        if path != self._path or (index < self._next - 1) or (self._last is not None and index < self._last[0]):
            self._open(path)
        if self._last is not None and self._last[0] == index:
            return self._last[1], self._last[2]
        assert self._frames is not None
        while self._next <= index:
            try:
                frame = next(self._frames)
            except StopIteration:
                raise SourceError(f"{path}: the decoder gave {self._next} frames, frame {index} was asked") from None
            except _av().error.FFmpegError as exc:
                raise SourceError(f"{path}: frame {self._next} cannot be decoded ({exc})") from None
            if self._next == index:
                self._last = (index, frame.to_ndarray(format="rgb24"), float(frame.time))
            self._next += 1
        assert self._last is not None and self._last[0] == index
        return self._last[1], self._last[2]

    def _open(self, path: str) -> None:
        self.close()
        av = _av()
        try:
            self._container = av.open(os.fspath(path))
            stream = self._container.streams.video[0]
            stream.thread_type = "AUTO"
        except (OSError, IndexError, av.error.FFmpegError) as exc:
            raise SourceError(f"{path}: cannot open as a video ({exc})") from None
        self._frames = iter(self._container.decode(stream))
        self._path, self._next, self._last = path, 0, None

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
        self._container, self._frames, self._path = None, None, None
