"""robomimic HDF5 files: one sample per time step, demos as groups, in robomimic's order.

A robomimic file holds ``data/demo_N/obs/<key>``, ``next_obs/<key>``,
``actions``, ``rewards``, ``dones`` (attribute ``num_samples``), filter lists
under ``mask/<filter>`` and ``env_args`` on ``data``. :func:`from_robomimic`
writes the layout described in ``torchrecord._robomimic.episodes``: demos contiguous and
in robomimic's order (sorted by their number), every next_obs key that is obs
shifted by one step stored once (each demo's final frame kept outside the
samples), and demo names, lengths, attributes, masks and ``env_args`` in the
user metadata. Read it back with
:class:`torchrecord.SequenceDataset` or :class:`torchrecord.WindowDataset`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._core import dtypes as _dtypes
from torchrecord._robomimic.episodes import DEMO_FIELD, META_KEY, SHIFT, STORED, VERSION, field_name, final_entry
from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import StoreOptions, WriteSettings, spell_out
from torchrecord._write.writer import RecordWriter, put_entries
from torchrecord.convert._common import KEYS, Converter, Option, existing, is_hdf5, names, require
from torchrecord.errors import ArgumentError, SourceError

__all__ = ["DEFAULT_DATASET_KEYS", "ROBOMIMIC", "from_robomimic", "is_robomimic"]

#: The dataset keys converted unless told otherwise.
DEFAULT_DATASET_KEYS = ("actions", "rewards", "dones")
_RESERVED = ("obs", "next_obs", DEMO_FIELD)


def _h5py() -> Any:
    return require("h5py", "hdf5", "reading robomimic HDF5 files")


def is_robomimic(source: str | os.PathLike[str]) -> bool:
    """True when an HDF5 file has robomimic's layout: ``data/<demo>`` groups with ``num_samples``."""
    try:
        h5py = _h5py()
        with h5py.File(os.fspath(source), "r") as f:
            data = f.get("data")
            if not isinstance(data, h5py.Group) or not len(data):
                return False
            first = data[next(iter(data.keys()))]
            return isinstance(first, h5py.Group) and "num_samples" in first.attrs and "obs" in first
    except (ImportError, OSError):
        return False


@dataclass(frozen=True)
class _Key:
    """One converted array: where it sits in a demo, its schema name, per-frame shape and dtype."""

    h5: str  # path inside the demo group
    name: str  # schema field name
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


@spell_out(StoreOptions)
def from_robomimic(
    hdf5_path: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    obs_keys: Sequence[str] | None = None,
    dataset_keys: Sequence[str] = DEFAULT_DATASET_KEYS,
    **options: Unpack[StoreOptions],
) -> RecordFile:
    """Convert a robomimic HDF5 file into a grouped record set, one sample per time step.

    Demos are read one at a time (memory holds one demo), from gzip-chunked or
    contiguous datasets alike, and written in robomimic's order (by demo number,
    gaps allowed). Each demo's ``num_samples`` is checked against every dataset
    in it. A ``next_obs`` key that equals ``obs`` shifted by one step (checked
    byte for byte in every demo) is stored once, plus the demo's final frame,
    which is kept beside the samples, not as one: every sample is a step of the
    file, so ``len()`` of the set is the file's step count and every reader
    (``RecordDataset``, ``load``, ...) gives exactly the file's steps. Any other
    ``next_obs`` key is stored as it is. Demo names, lengths and attributes, the
    filter masks, ``env_args`` and the other ``data`` attributes go into the
    user metadata (``RecordFile(path).user_metadata["robomimic"]``).

    Args:
        hdf5_path: the robomimic file.
        path: the record set to write.
        obs_keys: observation keys to convert; default: every key under the first
            demo's ``obs``.
        dataset_keys: per-step arrays to convert. A key no demo has is left out
            (robomimic then reads zeros under a cache mode, and so do the window
            datasets, with a ``MissingDatasetKeyWarning``); a key only some demos
            have is a SourceError.
        **options: the write options of how a set is stored
            (:class:`~torchrecord.StoreOptions`: ``overwrite``, ``metadata``,
            ``compression``, ...; ``metadata`` is stored beside
            ``"robomimic"``). ``compression={"obs.agentview_image": "zstd"}``
            compresses rendered camera images; ``samples_per_record=None`` packs
            small low-dim steps together, as ``write_record`` does.

    The other options of :func:`torchrecord.write_record` do not apply: the set
    keeps robomimic's demo order (``shuffle``, ``seed``; the windows are
    shuffled when read), is grouped by demo (``group_by``), reads the file in
    this process (``num_workers``, ``multiprocessing_context``), stops at the
    first bad demo (``on_error``, ``max_skipped``) and builds its own schema
    (``schema``).

    Raises:
        SourceError: the file is not robomimic's layout, a demo lacks a key or
            ``num_samples``, a dataset's length differs from ``num_samples``
            (naming the demo and key), shapes or dtypes differ between demos, or a
            mask names a demo the file lacks.
    """
    settings = WriteSettings.of(options, "from_robomimic", StoreOptions)
    src = existing(hdf5_path)
    h5py = _h5py()
    for key in dataset_keys:
        if key in _RESERVED or "." in key:
            raise ArgumentError(f"dataset key {key!r} is reserved or contains '.'; leave it out of dataset_keys")
    try:
        f = h5py.File(src, "r")
    except OSError as exc:
        raise SourceError(f"{src}: cannot open as HDF5 ({exc})") from None
    with f:
        demos = _demo_order(f, src)
        lengths = [_checked_length(f, src, d) for d in demos]
        keys = _describe(f, src, demos, obs_keys, dataset_keys)
        description = _description(f, src, demos, lengths, keys, dataset_keys)
        modes = _first_guess(f, keys["obs"], keys["next_obs"], demos[0])
        while True:  # a later demo that breaks a shift switches that key to stored and starts over
            broken = _write(f, src, path, demos, keys, modes, description, settings)
            if broken is None:
                break
            modes[broken] = STORED
    return RecordFile(path)


def _demo_order(f: Any, src: str) -> list[str]:
    data = f.get("data")
    if data is None or not len(data):
        raise SourceError(f"{src}: no 'data' group with demos; not a robomimic file (convert it with format='hdf5')")
    names = list(data.keys())
    try:
        numbers = [int(name[5:]) for name in names]  # robomimic sorts by int(name[5:]) ("demo_12" -> 12)
    except ValueError:
        raise SourceError(f"{src}: demo names must be demo_<number> as robomimic sorts them, got {names[:3]}") from None
    if len(set(numbers)) != len(numbers):
        raise SourceError(f"{src}: two demos have the same number ({names[:5]}...)")
    return [names[i] for i in np.argsort(numbers, kind="stable")]


def _checked_length(f: Any, src: str, demo: str) -> int:
    h5py = _h5py()
    group = f["data"][demo]
    if "num_samples" not in group.attrs:
        raise SourceError(f"{src}: demo {demo!r} has no num_samples attribute")
    n = int(group.attrs["num_samples"])
    if n < 1:
        raise SourceError(f"{src}: demo {demo!r} has num_samples={n}; every demo needs at least one step")
    bad: list[tuple[str, int]] = []

    def check(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and (obj.ndim == 0 or obj.shape[0] != n):
            bad.append((name, obj.shape[0] if obj.ndim else 0))

    group.visititems(check)
    if bad:
        name, rows = bad[0]
        raise SourceError(f"{src}: demo {demo!r}, key {name!r} has {rows} rows but num_samples is {n}")
    return n


def _describe(
    f: Any, src: str, demos: list[str], obs_keys: Sequence[str] | None, dataset_keys: Sequence[str]
) -> dict[str, list[_Key]]:
    """The arrays to convert, checked to exist with one shape and dtype in every demo."""
    data = f["data"]
    first = data[demos[0]]
    if obs_keys is None:
        if "obs" not in first:
            raise SourceError(f"{src}: demo {demos[0]!r} has no obs group")
        obs_keys = list(first["obs"].keys())
    has_next = ["next_obs" in data[d] for d in demos]
    if any(has_next) and not all(has_next):
        demo = demos[has_next.index(False)]
        raise SourceError(f"{src}: demo {demo!r} has no next_obs group while others have one")
    present = {k: [k in data[d] for d in demos] for k in dataset_keys}
    for k, flags in present.items():
        if any(flags) and not all(flags):
            raise SourceError(
                f"{src}: demo {demos[flags.index(False)]!r} lacks key {k!r} that other demos have; "
                "leave it out of dataset_keys"
            )
    keys: dict[str, list[_Key]] = {
        "obs": [_key(data, src, demos, f"obs/{k}", field_name("obs", k)) for k in obs_keys],
        "next_obs": [_key(data, src, demos, f"next_obs/{k}", field_name("next_obs", k)) for k in obs_keys]
        if all(has_next)
        else [],
        "dataset": [_key(data, src, demos, k, field_name(None, k)) for k in dataset_keys if all(present[k])],
    }
    return keys


def _key(data: Any, src: str, demos: list[str], h5: str, name: str) -> _Key:
    h5py = _h5py()
    spec: tuple[tuple[int, ...], np.dtype[Any]] | None = None
    for demo in demos:
        obj = data[demo].get(h5)
        if not isinstance(obj, h5py.Dataset):
            raise SourceError(f"{src}: demo {demo!r} has no dataset {h5!r}")
        here = (tuple(obj.shape[1:]), obj.dtype)
        if spec is None:
            try:
                _dtypes.from_numpy(obj.dtype)
            except TypeError:
                raise SourceError(f"{src}: demo {demo!r}, key {h5!r} has dtype {obj.dtype}, not storable") from None
            spec = here
        elif here != spec:
            raise SourceError(
                f"{src}: demo {demo!r}, key {h5!r} has frames of shape {list(here[0])} and dtype {here[1]}, "
                f"demo {demos[0]!r} has {list(spec[0])} and {spec[1]}"
            )
    assert spec is not None
    return _Key(h5, name, spec[0], spec[1])


def _first_guess(f: Any, obs: list[_Key], nxt: list[_Key], demo: str) -> dict[str, str]:
    """Per obs key, SHIFT when the first demo's next_obs is its obs shifted by one step."""
    group = f["data"][demo]
    modes = {}
    for o, n in zip(obs, nxt):
        key = o.h5[len("obs/") :]
        modes[key] = SHIFT if o.dtype == n.dtype and _is_shift(group[o.h5][()], group[n.h5][()]) else STORED
    return modes


def _is_shift(obs: np.ndarray, nxt: np.ndarray) -> bool:
    """next_obs[t] == obs[t + 1] byte for byte for every t < L - 1."""
    a, b = np.ascontiguousarray(nxt[:-1]), np.ascontiguousarray(obs[1:])
    return a.dtype == b.dtype and a.shape == b.shape and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def _plain(value: Any) -> Any:
    """An HDF5 attribute as a msgpack-able value."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.ndim else _plain(value[()])
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _description(
    f: Any, src: str, demos: list[str], lengths: list[int], keys: dict[str, list[_Key]], dataset_keys: Sequence[str]
) -> dict[str, Any]:
    """The metadata map, without the next_obs modes (known only once every demo was written)."""
    data = f["data"]
    masks: dict[str, list[str]] = {}
    if "mask" in f:
        for name, obj in f["mask"].items():
            listed = [_plain(v) for v in np.asarray(obj[()]).reshape(-1).tolist()]
            unknown = [d for d in listed if d not in data]
            if unknown:
                raise SourceError(f"{src}: mask {name!r} lists demo {unknown[0]!r}, which the file lacks")
            masks[name] = [str(d) for d in listed]
    data_attrs = {k: _plain(v) for k, v in data.attrs.items()}
    env_args = data_attrs.pop("env_args", None)
    if isinstance(env_args, str):
        try:
            json.loads(env_args)
        except ValueError:
            raise SourceError(f"{src}: data attribute env_args is not JSON") from None
    stored = [k.name for k in keys["dataset"]]
    return {
        "source_dataset_keys": _source_dataset_keys(f, demos),
        "version": VERSION,
        "source": os.path.basename(src),
        "demos": demos,
        "lengths": lengths,
        "attrs": [{k: _plain(v) for k, v in data[d].attrs.items()} for d in demos],
        "masks": masks,
        "env_args": env_args,
        "data_attrs": data_attrs,
        "obs_keys": [k.h5[len("obs/") :] for k in keys["obs"]],
        "dataset_keys": stored,
        "missing_dataset_keys": [k for k in dataset_keys if k not in stored],
    }


def _source_dataset_keys(f: Any, demos: list[str]) -> list[str]:
    """The per-step arrays (datasets directly in a demo group) that every demo has, in the first demo's order."""
    h5py = _h5py()
    data = f["data"]
    common = [k for k, v in data[demos[0]].items() if isinstance(v, h5py.Dataset)]
    for demo in demos[1:]:
        group = data[demo]
        common = [k for k in common if isinstance(group.get(k), h5py.Dataset)]
    return [str(k) for k in common]


def _write(
    f: Any,
    src: str,
    path: str | os.PathLike[str],
    demos: list[str],
    keys: dict[str, list[_Key]],
    modes: dict[str, str],
    description: dict[str, Any],
    settings: WriteSettings,
) -> str | None:
    """Write the set with these next_obs modes; returns a key whose shift breaks (nothing published), or None."""
    data = f["data"]
    stored_next = [n for n in keys["next_obs"] if modes[n.h5[len("next_obs/") :]] == STORED]
    shifted = [o for o in keys["obs"] if keys["next_obs"] and modes[o.h5[len("obs/") :]] == SHIFT]
    meta = {**(settings.metadata or {}), "source_format": "robomimic"}
    meta[META_KEY] = {
        **description,
        "next_obs": dict(modes) if keys["next_obs"] else {},
        "final_keys": [o.h5[len("obs/") :] for o in shifted],
    }
    writer = RecordWriter(
        path,
        overwrite=settings.overwrite,
        shuffle=False,
        group_by=DEMO_FIELD,
        progress=settings.progress,
        metadata=meta,
        checksums=settings.checksums,
        initial_map_size=settings.initial_map_size,
        commit_bytes=settings.commit_bytes,
        compression=settings.compression,
        compression_level=settings.compression_level,
        samples_per_record=settings.samples_per_record,
    )
    try:
        for position, demo in enumerate(demos):
            group = data[demo]
            arrays = {k.h5: _read(group, src, demo, k.h5) for k in keys["obs"] + keys["dataset"] + stored_next}
            finals = []
            for o in shifted:
                key = o.h5[len("obs/") :]
                nxt = _read(group, src, demo, f"next_obs/{key}")
                if not _is_shift(arrays[o.h5], nxt):
                    writer.abort()
                    return key
                finals.append(np.asarray(nxt[-1]))
            if shifted:  # the final next_obs frames: kept beside the samples, in no reader's index
                put_entries(writer, [final_entry(position, finals)])
            for t in range(int(description["lengths"][position])):
                writer.append(_step(position, t, arrays, keys, stored_next))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return None


def _read(group: Any, src: str, demo: str, h5: str) -> np.ndarray:
    try:
        return np.asarray(group[h5][()])
    except OSError as exc:
        raise SourceError(f"{src}: demo {demo!r}, key {h5!r} cannot be read ({exc})") from None


def _step(position: int, t: int, arrays: dict[str, np.ndarray], keys: dict[str, list[_Key]], nxt: list[_Key]) -> Any:
    sample: dict[str, Any] = {DEMO_FIELD: position}
    sample["obs"] = {o.h5[len("obs/") :]: arrays[o.h5][t] for o in keys["obs"]}
    if nxt:
        sample["next_obs"] = {n.h5[len("next_obs/") :]: arrays[n.h5][t] for n in nxt}
    for k in keys["dataset"]:
        sample[k.name] = arrays[k.h5][t]
    return sample


_SHARDS = "a robomimic set is grouped by demo and a sharded set has no groups"
_ORDER = "the set keeps robomimic's demo order (the windows are shuffled when read)"
_IN_PROCESS = "the file is read in this process, one demo at a time"
_STOPS = "a bad demo stops the conversion"

ROBOMIMIC = Converter(
    "robomimic",
    from_robomimic,
    "robomimic demos (HDF5 with data/demo_N groups, detected by layout): one sample per time step, "
    "grouped by demo in robomimic's order (not shuffled), for torchrecord.SequenceDataset and "
    "WindowDataset; --keys chooses the obs keys, --dataset-keys the per-step arrays",
    lambda probe: is_hdf5(probe) and is_robomimic(probe.path),
    rank=40,  # before the generic HDF5 converter
    options=(
        KEYS,
        Option(
            "dataset_keys",
            None,
            "Sequence[str] | None",
            "--dataset-keys",
            "robomimic: comma-separated per-step arrays to convert (default: actions,rewards,dones)",
            {"type": names, "metavar": "NAMES"},
        ),
    ),
    parameters={"keys": "obs_keys"},
    refused={
        "num_shards": _SHARDS,
        "shard": _SHARDS,
        "shuffle": _ORDER,
        "seed": _ORDER,
        "num_workers": _IN_PROCESS,
        "multiprocessing_context": _IN_PROCESS,
        "on_error": _STOPS,
        "max_skipped": _STOPS,
        "group_by": "the set is grouped by demo",
        "schema": "the converter builds the schema from the file",
    },
    defaults={"shuffle": False},
)
