"""Reading a LeRobot v3.0 dataset folder: its description checked, its frames' columns as NumPy arrays.

:class:`LeRobotSource` reads ``meta/info.json``, ``meta/stats.json``, the task
table (``meta/tasks.parquet``, task strings by position) and the episode table
(``meta/episodes/*/*.parquet``, without the per-episode stats), checks that the
episodes are numbered in order and cover the frames one after another, and
reads the data tables (``data/*/*.parquet``, in file-name order, as LeRobot
loads them) a batch of rows at a time: numbers and fixed-shape lists as arrays,
embedded images decoded to uint8 ``[H, W, C]``. :func:`find_lerobot` finds a
dataset's folder from a path or a repo id already in the local cache.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from torchrecord.convert.lerobot_video import need
from torchrecord.errors import SourceError

__all__ = ["LeRobotSource", "find_lerobot", "is_lerobot"]

#: Rows read from a data file at a time.
_BATCH_ROWS = 256
_INFO = os.path.join("meta", "info.json")


def _pq() -> Any:
    need("pyarrow", "reading a LeRobot dataset")
    return need("pyarrow.parquet", "reading a LeRobot dataset")


def is_lerobot(source: str | os.PathLike[str]) -> bool:
    """True for a folder holding ``meta/info.json`` of a LeRobot dataset (any format version)."""
    path = os.path.join(os.fspath(source), _INFO)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and "codebase_version" in info and "features" in info


def find_lerobot(source: str | os.PathLike[str]) -> str:
    """The local folder of ``source``: a folder, or a repo id (``org/name``) already in the local Hugging Face cache.

    A repo id is looked up, without network, in LeRobot's home
    (``$HF_LEROBOT_HOME``, default ``$HF_HOME/lerobot``) and in the hub cache
    (``$HF_HUB_CACHE``, default ``$HF_HOME/hub``: its ``refs/main`` snapshot).
    """
    path = os.fspath(source)
    if os.path.isdir(path):
        return path
    parts = path.split("/")
    if len(parts) == 2 and all(parts) and not os.path.exists(path):
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser(os.path.join("~", ".cache")), "huggingface"
        )
        lerobot_home = os.path.expanduser(os.environ.get("HF_LEROBOT_HOME") or os.path.join(home, "lerobot"))
        candidates = [os.path.join(lerobot_home, *parts)]
        repo = os.path.join(
            os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"), f"datasets--{parts[0]}--{parts[1]}"
        )
        try:
            with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
                candidates.append(os.path.join(repo, "snapshots", f.read().strip()))
        except OSError:
            pass
        for folder in candidates:
            if is_lerobot(folder):
                return folder
        raise SourceError(
            f"{path}: no such folder, and no LeRobot dataset of that repo id in the local cache (looked in "
            f"{', '.join(candidates)}); nothing is downloaded: fetch it first (e.g. huggingface-cli download "
            f"--repo-type dataset {path} --local-dir DIR) and convert DIR"
        )
    raise SourceError(f"{path}: no such folder; a LeRobot dataset is a folder with {_INFO}")


class LeRobotSource:
    """A LeRobot v3.0 folder: its description read and checked, its frames read in order."""

    def __init__(self, root: str) -> None:
        self.root = root
        info = self._json(_INFO)
        if not isinstance(info, dict) or "features" not in info or "fps" not in info:
            raise SourceError(f"{self.at(_INFO)}: not a LeRobot info.json (no features or fps)")
        version = str(info.get("codebase_version", ""))
        if not version.startswith("v3."):
            raise SourceError(
                f"{self.at(_INFO)}: LeRobot format {version or '(none)'}; this converter reads v3.0: convert the "
                "dataset with LeRobot's convert_dataset_v21_to_v30 first"
            )
        self.info: dict[str, Any] = info
        self.fps = info["fps"]
        features: dict[str, Any] = info["features"]
        self.video_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        self.cameras = [k for k, f in features.items() if f.get("dtype") in ("video", "image")]
        self.columns = [k for k in features if k not in self.video_keys]
        for key, f in features.items():
            if f.get("dtype") == "string" or key == "task":
                raise SourceError(
                    f"{self.at(_INFO)}: feature {key!r} holds strings, which this converter does not store"
                )
        self.stats = self._json(os.path.join("meta", "stats.json")) if self._exists("meta", "stats.json") else None
        self.tasks = self._tasks()
        self.episodes = self._episodes()
        self.data_files = self._parquet_files("data")
        if not self.data_files:
            raise SourceError(f"{self.at('data')}: holds no parquet files")

    # -- the description --------------------------------------------------------------
    def at(self, *rel: str) -> str:
        return os.path.join(self.root, *rel)

    def _exists(self, *rel: str) -> bool:
        return os.path.exists(self.at(*rel))

    def _json(self, rel: str) -> Any:
        try:
            with open(self.at(rel), encoding="utf-8") as f:
                return json.load(f)
        except OSError as exc:
            raise SourceError(f"{self.at(rel)}: cannot read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise SourceError(f"{self.at(rel)}: not JSON ({exc})") from None

    def _parquet_files(self, rel: str) -> list[str]:
        folder = self.at(rel)
        if not os.path.isdir(folder):
            return []
        return sorted(
            os.path.join(folder, d, n)
            for d in os.listdir(folder)
            if os.path.isdir(os.path.join(folder, d))
            for n in os.listdir(os.path.join(folder, d))
            if n.endswith(".parquet")
        )

    def _table(self, paths: list[str], rel: str) -> Any:
        pq = _pq()
        pa = need("pyarrow", "reading a LeRobot dataset")

        if not paths:
            raise SourceError(f"{self.at(rel)}: missing (no parquet files)")
        try:
            return pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"{self.at(rel)}: cannot read its parquet files ({exc})") from None

    def _tasks(self) -> list[str]:
        rel = os.path.join("meta", "tasks.parquet")
        table = self._table([self.at(rel)] if self._exists(rel) else [], rel)
        pandas = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
        names = [c for c in pandas.get("index_columns", []) if isinstance(c, str)] or ["task"]
        if names[0] not in table.column_names:
            raise SourceError(f"{self.at(rel)}: has no task strings (column {names[0]!r})")
        return [str(t) for t in table.column(names[0]).to_pylist()]

    def _episodes(self) -> dict[str, list[Any]]:
        rel = os.path.join("meta", "episodes")
        table = self._table(self._parquet_files(rel), rel)
        cols = {n: table.column(n).to_pylist() for n in table.column_names if not n.startswith("stats/")}
        where = self.at(rel)
        for name in ("episode_index", "dataset_from_index", "dataset_to_index"):
            if name not in cols:
                raise SourceError(f"{where}: the episode table has no {name!r} column")
        index = cols["episode_index"]
        if index != list(range(len(index))):
            raise SourceError(f"{where}: episodes must be numbered 0, 1, 2... in order (found {index[:5]}...)")
        start, end = cols["dataset_from_index"], cols["dataset_to_index"]
        for e, (a, b) in enumerate(zip(start, end)):
            if a != (end[e - 1] if e else 0) or b <= a:
                raise SourceError(f"{where}: episode {e} holds frames [{a}, {b}), not the ones after episode {e - 1}")
        if end[-1] != self.info.get("total_frames", end[-1]):
            raise SourceError(
                f"{where}: the episodes hold {end[-1]} frames, info.json says {self.info['total_frames']}"
            )
        return cols

    def video_file(self, key: str, e: int) -> str:
        ep = self.episodes
        try:
            rel = self.info["video_path"].format(
                video_key=key,
                chunk_index=ep[f"videos/{key}/chunk_index"][e],
                file_index=ep[f"videos/{key}/file_index"][e],
            )
        except (KeyError, IndexError, AttributeError) as exc:
            raise SourceError(f"{self.at(_INFO)}: cannot find the video of {key!r} for episode {e} ({exc})") from None
        return self.at(rel)

    # -- the frames ------------------------------------------------------------------------------
    def rows(self, lo: int, hi: int, names: list[str]) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Batches of columns ``names`` of frames ``[lo, hi)``, as (first frame, {column: values})."""
        pq = _pq()
        pa = need("pyarrow", "reading a LeRobot dataset")
        start = 0  # the first frame of the file
        for path in self.data_files:
            try:
                f = pq.ParquetFile(path)
                total = f.metadata.num_rows
                if start < hi and lo < start + total:  # else not read
                    missing = [n for n in names if n not in f.schema_arrow.names]
                    if missing:
                        raise SourceError(f"{path}: has no column {missing[0]!r}, which info.json lists")
                    at = start
                    for batch in f.iter_batches(batch_size=_BATCH_ROWS, columns=names):
                        a, b = max(lo, at), min(hi, at + batch.num_rows)
                        if a < b:
                            part = batch.slice(a - at, b - a)
                            yield a, {name: _column(part.column(name), path, name, a) for name in names}
                        at += batch.num_rows
            except (OSError, pa.ArrowException) as exc:
                raise SourceError(f"{path}: cannot read as parquet ({exc})") from None
            start += total
        if start < hi:
            raise SourceError(f"{self.at('data')}: holds {start} frames, the episode table {hi}")


def _column(column: Any, path: str, name: str, first: int) -> np.ndarray:
    """An Arrow column as [rows, ...] NumPy values (images as decoded uint8 [H, W, C])."""
    pa = need("pyarrow", "reading a LeRobot dataset")

    if column.null_count:
        row = first + int(np.flatnonzero(np.asarray(column.is_null()))[0])
        raise SourceError(f"{path}: frame {row}, column {name!r} is null")
    typ = column.type
    if pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0:
        return _images(column.field("bytes").to_pylist(), path, name, first)
    shape: list[int] = []
    values = column
    while (
        pa.types.is_fixed_size_list(values.type) or pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
    ):
        n = len(values)
        flat = values.flatten()
        if n and len(flat) % n:
            raise SourceError(f"{path}: column {name!r} has rows of different lengths near frame {first}")
        size = len(flat) // n if n else values.type.list_size
        if not pa.types.is_fixed_size_list(values.type):
            lengths = np.diff(np.asarray(values.offsets))
            if (lengths != size).any():
                raise SourceError(f"{path}: column {name!r} has rows of different lengths near frame {first}")
        shape.append(size)
        values = flat
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise SourceError(f"{path}: column {name!r} holds {typ}, which this converter does not store")
    flat_values = values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat_values.reshape(len(column), *shape))


def _images(encoded: list[bytes | None], path: str, name: str, first: int) -> np.ndarray:
    pil = need("PIL.Image", "decoding a LeRobot dataset's images")
    out = []
    for i, data in enumerate(encoded):
        if data is None:
            raise SourceError(f"{path}: frame {first + i}, image {name!r} has no embedded bytes")
        try:
            with pil.open(io.BytesIO(data)) as image:
                pixels = np.array(image)
                mode = image.mode
        except (OSError, ValueError) as exc:
            raise SourceError(f"{path}: frame {first + i}, image {name!r} cannot be decoded ({exc})") from None
        if pixels.dtype != np.uint8 or mode == "1":
            raise SourceError(
                f"{path}: frame {first + i}, image {name!r} has mode {mode}; only 8-bit images are stored"
            )
        out.append(pixels if pixels.ndim == 3 else pixels[:, :, None])
    shapes = {p.shape for p in out}
    if len(shapes) > 1:
        raise SourceError(f"{path}: image {name!r} changes size near frame {first}: {sorted(shapes)}")
    return np.stack(out) if out else np.zeros((0, 0, 0, 0), np.uint8)
