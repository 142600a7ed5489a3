"""Convert common dataset layouts into record sets (what ``torchrecord convert`` runs).

========  ====================================  ==============================================
format    source                                sample
========  ====================================  ==============================================
folder    ``root/<class>/<image>`` tree          ``{"image": bytes, "label": int, "path": str}``;
                                                the class names are ``user_metadata["classes"]``
list      text file of ``<path> <label>`` lines  ``{"image": bytes, "label": int, "path": str}``
npy       one ``.npy`` array                     its row ``array[i]``
npz       ``.npz`` archive                       ``{name: array[i]}`` over its arrays
hdf5      HDF5 file                              ``{name: dataset[i]}`` (groups nest dicts)
lerobot   LeRobot v3.0 folder (or a repo id in   one frame, episodes together, cameras as
          the local Hugging Face cache)         uint8 [H, W, C]; see :func:`from_lerobot`
robomimic robomimic HDF5 (``data/demo_N/...``)    one time step, demos as groups (each
                                                demo's final next_obs frame kept beside
                                                the steps); see :func:`from_robomimic`
hf        a ``save_to_disk`` folder or a folder  ``{column: value}`` per row; see :func:`from_hf`
          of parquet files (or, from Python, a   (also a ``Dataset``/``DatasetDict``/
          ``datasets`` object)                   ``IterableDataset`` object)
webdataset  WebDataset ``.tar`` shards          ``{"__key__": str, <ext>: value}``; see
                                                :func:`from_webdataset`
========  ====================================  ==============================================

Every converter returns the :class:`~torchrecord.RecordFile` it wrote and takes
every option of :func:`torchrecord.write_record` (``shuffle``, ``seed``,
``num_workers``, ``on_error``, ``compression``, ...), with the same defaults,
and ``shard``/``num_shards`` to write one shard of a sharded set
(:func:`torchrecord.write_shard`). The user metadata also records
``source_format``. robomimic files (detected before the generic HDF5 converter)
keep robomimic's demo order: the options that do not apply to them (``seed``,
``num_workers``, ``on_error``, ...; the windows are shuffled when read) are
refused, ``keys`` chooses their obs keys and ``dataset_keys`` their per-step
arrays. An option that applies only to other formats (``check_images``,
``keep_paths``, ``extensions``, ``dataset_keys``) is refused when given another
value than its default for a source it does not apply to. Images are stored encoded; use
``RecordDataset(path, transform=torchrecord.transforms.decode_image)`` to decode
them after shuffling. Pillow (``images`` extra) and h5py (``hdf5`` extra) are
imported only when needed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, Literal

from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import WriteSettings
from torchrecord._write.writer import SchemaArg
from torchrecord.convert._common import existing
from torchrecord.convert.arrays import from_numpy
from torchrecord.convert.hdf5 import from_hdf5
from torchrecord.convert.hf import from_hf, is_hf_folder
from torchrecord.convert.images import IMG_EXTENSIONS, from_image_folder, from_list_file
from torchrecord.convert.lerobot import convert_options as _lerobot_options
from torchrecord.convert.lerobot import from_lerobot, is_lerobot
from torchrecord.convert.robomimic import from_robomimic, is_robomimic
from torchrecord.convert.wds import from_webdataset
from torchrecord.errors import ArgumentError, SourceError

__all__ = [
    "CONVERTERS",
    "FORMATS",
    "convert",
    "detect_format",
    "from_hdf5",
    "from_hf",
    "from_image_folder",
    "from_lerobot",
    "from_list_file",
    "from_numpy",
    "from_robomimic",
    "from_webdataset",
    "is_lerobot",
    "is_robomimic",
]

#: The converter of each source format.
CONVERTERS: dict[str, Callable[..., RecordFile]] = {
    "folder": from_image_folder,
    "list": from_list_file,
    "npy": from_numpy,
    "npz": from_numpy,
    "hdf5": from_hdf5,
    "robomimic": from_robomimic,
    "lerobot": from_lerobot,
    "hf": from_hf,
    "webdataset": from_webdataset,
}
#: Format names accepted by :func:`convert` (besides ``"auto"``).
FORMATS = tuple(CONVERTERS)

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def detect_format(source: str | os.PathLike[str]) -> str:
    """Guess a source's format: a directory is ``folder`` (or ``hf``); files are told by content.

    A directory written by ``save_to_disk``, or one holding parquet files and
    no image files, is ``hf``; a tar file is ``webdataset``.

    NumPy and HDF5 files are recognized by their signature bytes (HDF5 also by
    suffix; one with robomimic's layout is ``robomimic``); any other file
    without NUL bytes in its first 64 KiB is taken as a ``list`` file.
    SourceError if the path is missing or the format is unclear.
    """
    path = os.fspath(source)
    if os.path.isdir(path):
        return "lerobot" if is_lerobot(path) else "hf" if is_hf_folder(path) else "folder"
    existing(path)
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head[257:262] == b"ustar" or path.endswith((".tar", ".tar.gz", ".tgz")):
        return "webdataset"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "npz"
    if any(head[at : at + 8] == _HDF5_MAGIC for at in (0, 512, 1024, 2048)) or path.endswith(_HDF5_SUFFIXES):
        return "robomimic" if is_robomimic(path) else "hdf5"
    if head and b"\0" not in head:
        return "list"
    raise SourceError(f"{path}: cannot tell its format; choose one with format= (--format): {', '.join(FORMATS)}")


#: write_record's options that do not apply to a robomimic source (see :func:`from_robomimic`), and why.
_NOT_ROBOMIMIC = {
    "num_shards": "a robomimic set is grouped by demo and a sharded set has no groups",
    "shard": "a robomimic set is grouped by demo and a sharded set has no groups",
    "seed": "the set keeps robomimic's demo order (the windows are shuffled when read)",
    "num_workers": "the file is read in this process, one demo at a time",
    "multiprocessing_context": "the file is read in this process, one demo at a time",
    "on_error": "a bad demo stops the conversion",
    "max_skipped": "a bad demo stops the conversion",
    "group_by": "the set is grouped by demo",
    "schema": "the converter builds the schema from the file",
}


#: Options of :func:`convert` that apply to some formats only: the formats, and the default.
_FORMAT_OPTIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "check_images": (("folder", "list"), True),
    "keep_paths": (("folder", "list"), True),
    "extensions": (("folder",), tuple(IMG_EXTENSIONS)),
    "dataset_keys": (("robomimic",), None),
}


def convert(
    source: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    keys: Sequence[str] | None = None,
    split: str | None = None,
    dataset_keys: Sequence[str] | None = None,
    check_images: bool = True,
    extensions: Sequence[str] | None = IMG_EXTENSIONS,
    keep_paths: bool = True,
    shard: int | None = None,
    num_shards: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    max_skipped: int | float | None = None,
    checksums: bool = True,
    samples_per_record: int | None = None,
    group_by: str | Callable[[Any], Any] | None = None,
    schema: SchemaArg = None,
    initial_map_size: int = 1 << 28,
    commit_bytes: int = 64 << 20,
    multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
    compression: Literal["zstd", "lz4"] | Mapping[str, Literal["zstd", "lz4"] | None] | None = None,
    compression_level: int | None = None,
) -> Any:
    """Convert ``source`` into a record set at ``path`` with the converter of its format.

    Args:
        source: a folder, list file, ``.npy``/``.npz``, HDF5 or tar file, or a
            Hugging Face dataset folder.
        path: the record set to write (a folder with ``num_shards``).
        format: one of :data:`FORMATS`, or ``"auto"`` (:func:`detect_format`).
        keys: arrays to convert (``npz`` and ``hdf5``), obs keys (``robomimic``),
            columns (``hf``).
        dataset_keys: ``robomimic`` only: the per-step arrays to convert (default:
            ``actions``, ``rewards``, ``dones``; see :func:`from_robomimic`).
        split: the split of an ``hf`` dataset dict to convert (default: every
            split, each to ``path/<split>``, and a dict of split -> RecordFile
            is returned).
        check_images: decode each image while converting (``folder`` and ``list``
            only; see :func:`from_image_folder`).
        extensions: the file extensions a ``folder`` is scanned for (None: every file).
        keep_paths: store each image's file path as the ``"path"`` field
            (``folder`` and ``list`` only).
        shard, num_shards: write shard ``shard`` of ``num_shards`` of a sharded
            set in the folder ``path`` (see :func:`torchrecord.write_shard`).
        shuffle, seed, num_workers, overwrite, progress, metadata, on_error,
        max_skipped, checksums, samples_per_record, group_by, schema,
        initial_map_size, commit_bytes, multiprocessing_context, compression,
        compression_level: as for :func:`torchrecord.write_record`, with the
            same defaults. A robomimic source keeps its demo order whatever
            ``shuffle`` says, and refuses the options that do not apply to it
            (ValueError naming the option; see :func:`from_robomimic`).
    """
    settings = WriteSettings.of(locals())
    fmt = detect_format(source) if format == "auto" else format
    if fmt not in CONVERTERS:
        raise ArgumentError(f"unknown source format {format!r}; choose one of auto, {', '.join(FORMATS)}")
    chosen: dict[str, Any] = {"check_images": check_images, "keep_paths": keep_paths, "dataset_keys": dataset_keys}
    chosen["extensions"] = extensions if extensions is None else tuple(extensions)
    for name, (formats, default) in _FORMAT_OPTIONS.items():
        if fmt not in formats and chosen[name] != default:
            raise ArgumentError(
                f"{name}={chosen[name]!r} does not apply to a {fmt} source ({os.fspath(source)}): it is for "
                f"{' and '.join(formats)} sources; leave it out"
            )
    written = {f.name: getattr(settings, f.name) for f in fields(WriteSettings)}
    sharding = {"shard": shard, "num_shards": num_shards}
    if fmt == "robomimic":
        defaults = {**dataclasses.asdict(WriteSettings()), "shard": None, "num_shards": None}
        given = {**written, **sharding}
        for name, why in _NOT_ROBOMIMIC.items():
            if given[name] != defaults[name]:
                raise ArgumentError(
                    f"{name}={given[name]!r} does not apply to a robomimic source ({os.fspath(source)}): {why}; "
                    "leave it out"
                )
        applies = {name: value for name, value in written.items() if name not in _NOT_ROBOMIMIC and name != "shuffle"}
        if dataset_keys is not None:
            applies["dataset_keys"] = dataset_keys
        return from_robomimic(source, path, obs_keys=keys, **applies)
    options: dict[str, Any] = {}
    if keys is not None:
        if fmt not in ("npz", "hdf5", "hf"):
            raise ArgumentError(
                f"keys (--keys) choose arrays of npz and hdf5 sources (columns of hf ones), not of a {fmt} source"
            )
        options["keys"] = keys
    if split is not None:
        if fmt != "hf":
            raise ArgumentError(f"split (--split) chooses a split of an hf source, not of a {fmt} source")
        options["split"] = split
    if fmt == "lerobot":  # frame order kept; the options that do not apply are refused
        return from_lerobot(source, path, **_lerobot_options(os.fspath(source), {**written, **sharding}))
    if fmt in ("folder", "list"):
        options["check_images"] = check_images
        options["keep_paths"] = keep_paths
    if fmt == "folder":
        options["extensions"] = extensions
    return CONVERTERS[fmt](source, path, **options, **sharding, **written)
