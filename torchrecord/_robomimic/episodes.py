"""A record set converted from a robomimic HDF5 file: what it holds, read back from its metadata.

``torchrecord.convert.from_robomimic`` writes one record per time step, demo
after demo in robomimic's order (a grouped set: group ``g`` is demo ``g``, and
there is no other group)::

    {"demo": int64 demo position, "obs": {key: frame}, "next_obs": {key: frame},
     <dataset key>: value, ...}

Every sample is a real step of the source, so every reader (``RecordDataset``,
``load``, ...) gives exactly the file's steps. ``next_obs`` holds only the keys
whose ``next_obs`` is not ``obs`` shifted by one step. For the others (the
*final keys*), ``next_obs[t]`` is ``obs[t + 1]`` and each demo's final
``next_obs`` frame is kept outside the samples: in the ``meta`` database under
``FINAL_PREFIX + 8-byte big-endian demo position``, a CRC-32 (4 bytes
little-endian, of the rest) followed by that demo's final frame of each final
key, in ``final_keys`` order, raw little-endian in C order. The user metadata
``"robomimic"`` map (this module's :data:`META_KEY`, description version 2)
describes it all; :class:`RoboSet` reads it.

Description version 1 (before 0.2) kept the final frames in a last group of
*tail records* (``"demo": -1``, zeros elsewhere), which the generic readers
handed out as steps; :class:`RoboSet` still reads such a set for the window
datasets (``tail_group`` in its metadata).

The window datasets address a final frame as the virtual record
``tail_first + demo`` (``tail_first`` = the sample count in version 2, the tail
group's first record in version 1): :class:`FinalFrames` reads those past the
samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.crc import crc32
from torchrecord._core.schema import Field
from torchrecord._store import format as _format
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, ChecksumError, CorruptRecordError, FormatError, VersionError

__all__ = [
    "DEMO_FIELD",
    "FINAL_PREFIX",
    "FinalFrames",
    "META_KEY",
    "RoboSet",
    "SHIFT",
    "STORED",
    "TAIL_DEMO",
    "VERSION",
    "field_name",
    "final_entry",
]

#: The user metadata key of the description.
META_KEY = "robomimic"
#: Version of the description (bumped when readers must change): 2 keeps the final frames in the meta database.
VERSION = 2
#: The per-record field holding the demo's position (``TAIL_DEMO`` in the tail records of version 1).
DEMO_FIELD = "demo"
TAIL_DEMO = -1
#: The meta-database key prefix of a demo's final frames (version 2).
FINAL_PREFIX = b"robomimic/final/"
_CRC = 4
#: How a key's next_obs is stored: as obs shifted by one step (plus a tail record), or as its own field.
SHIFT = "shift"
STORED = "stored"


def field_name(group: str | None, key: str) -> str:
    """The schema name of an obs (``group="obs"``), next_obs or dataset (``group=None``) key."""
    return key if group is None else f"{group}.{key}"


def final_entry(demo: int, frames: Sequence[np.ndarray]) -> tuple[bytes, bytes]:
    """The meta-database entry of demo ``demo``'s final frames (one per final key, in order)."""
    body = b"".join(np.ascontiguousarray(f, dtype=f.dtype.newbyteorder("<")).tobytes() for f in frames)
    return FINAL_PREFIX + _format.encode_key(demo), crc32(body).to_bytes(_CRC, "little") + body


class FinalFrames:
    """Each demo's final ``next_obs`` frame of the final keys, read from the meta database (version 2).

    Args:
        file: the converted set.
        keys: the final keys (obs keys), in stored order.
        fields: schema field name -> Field (the frames have the ``obs.<key>`` field's shape and dtype).
        demos: how many demos the set holds.
    """

    def __init__(self, file: RecordSet, keys: Sequence[str], fields: dict[str, Field], demos: int) -> None:
        self.file, self.demos = file, demos
        self.spans: dict[str, tuple[int, tuple[int, ...], np.dtype[Any]]] = {}  # field -> (offset, shape, dtype)
        at = _CRC
        for key in keys:
            f = fields[field_name("obs", key)]
            shape = tuple(int(d or 0) for d in f.shape)
            dtype = np.dtype(_dtypes.by_name(f.dtype).numpy)
            self.spans[f.name] = (at, shape, dtype)
            at += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.size = at

    def read(self, demos: np.ndarray, names: Sequence[str], *, verify: bool) -> dict[str, np.ndarray]:
        """Fields ``names`` of the final frames of ``demos``: [n, *frame]; zeros for a field with no final frame."""
        out: dict[str, np.ndarray] = {}
        for name in names:
            if name in self.spans:
                _, shape, dtype = self.spans[name]
                out[name] = np.empty((len(demos), *shape), dtype)
        if not len(demos) or not out:
            return out
        path = self.file.path
        env, _ = self.file.environment()  # type: ignore[attr-defined]
        with _format.lmdb_errors(path), env.begin() as txn:
            db = env.open_db(_format.META_DB, create=False)
            for i, d in enumerate(demos.tolist()):
                raw = txn.get(FINAL_PREFIX + _format.encode_key(d), db=db)
                where = f"{path}: the final next_obs frames of demo {d}"
                if raw is None:
                    raise CorruptRecordError(f"{where} are missing; convert the HDF5 file again")
                if len(raw) != self.size:
                    raise CorruptRecordError(f"{where} hold {len(raw)} bytes, not {self.size}; convert it again")
                if verify and crc32(raw[_CRC:]) != int.from_bytes(raw[:_CRC], "little"):
                    raise ChecksumError(f"{where} fail their CRC-32: the file is damaged; convert the HDF5 file again")
                for name, array in out.items():
                    at, _, dtype = self.spans[name]
                    count = array[i].size
                    array[i] = np.frombuffer(raw, dtype.newbyteorder("<"), count, at).reshape(array.shape[1:])
        return out


@dataclass(frozen=True)
class RoboSet:
    """The demos of a converted set and where each frame is stored.

    Attributes:
        path: the record set.
        demos: demo names, in stored (robomimic's) order.
        lengths: frames of each demo (int64).
        first: the stored record of each demo's frame 0 (int64).
        tail_first: the (virtual) record of demo 0's final next_obs frame, demo ``d``'s
            at ``tail_first + d``: the sample count in version 2 (read through
            ``finals``), the tail group's first record in version 1; None when
            no key is stored as a shift.
        finals: the reader of the final frames (version 2), else None.
        obs_keys: observation keys, in stored order.
        next_obs: per obs key, ``SHIFT`` or ``STORED``; empty when the source had no next_obs.
        dataset_keys: dataset keys stored (``actions``...).
        missing_dataset_keys: keys asked for at conversion that no demo had.
        source_dataset_keys: the per-step arrays every demo of the source has
            (converted or not); None for a set converted before they were recorded.
        masks: filter key -> demo names.
        fields: schema field name -> Field.
    """

    path: str
    demos: tuple[str, ...]
    lengths: np.ndarray
    first: np.ndarray
    tail_first: int | None
    finals: FinalFrames | None
    obs_keys: tuple[str, ...]
    next_obs: dict[str, str]
    dataset_keys: tuple[str, ...]
    missing_dataset_keys: tuple[str, ...]
    source_dataset_keys: tuple[str, ...] | None
    masks: dict[str, list[str]]
    fields: dict[str, Field]

    @classmethod
    def open(cls, file: RecordSet) -> RoboSet:
        """The description of ``file``; ValueError when it was not converted from robomimic."""
        meta = file.user_metadata.get(META_KEY)
        if not isinstance(meta, dict):
            raise ArgumentError(
                f"{file.path}: not a set converted from robomimic (no {META_KEY!r} user metadata); "
                "convert the HDF5 file with torchrecord.convert.from_robomimic or `torchrecord convert`"
            )
        if int(meta.get("version", 0)) > VERSION:
            raise VersionError(
                f"{file.path}: its robomimic description has version {meta.get('version')}, this torchrecord "
                f"reads up to {VERSION}: upgrade torchrecord"
            )
        offsets = file.groups
        if offsets is None and file.num_shards > 1:
            raise ArgumentError(
                f"{file.path}: a sharded set has no groups, and a robomimic set needs one per demo: convert the "
                "HDF5 file into one record-set file with torchrecord.convert.from_robomimic"
            )
        demos = tuple(str(d) for d in meta["demos"])
        lengths = np.asarray(meta["lengths"], dtype=np.int64)
        tails = bool(meta.get("tail_group"))  # version 1: the final frames in a last group of tail records
        expected = len(demos) + (1 if tails else 0)
        if offsets is None or len(offsets) - 1 != expected:
            raise FormatError(f"{file.path}: the groups do not match the {len(demos)} demos its metadata lists")
        first = np.asarray(offsets[: len(demos)], dtype=np.int64)
        if not np.array_equal(np.diff(offsets)[: len(demos)], lengths):
            raise FormatError(f"{file.path}: the demo lengths in the metadata do not match its groups")
        obs_keys = tuple(str(k) for k in meta["obs_keys"])
        fields = {f.name: f for f in file.schema.fields}
        final_keys = tuple(str(k) for k in meta.get("final_keys") or ())
        unknown = [k for k in final_keys if field_name("obs", k) not in fields]
        if unknown or (final_keys and tails):
            raise FormatError(f"{file.path}: its robomimic metadata lists final frames of keys it lacks")
        finals = FinalFrames(file, final_keys, fields, len(demos)) if final_keys else None
        tail_first = int(offsets[len(demos)]) if tails or final_keys else None
        source = meta.get("source_dataset_keys")
        return cls(
            path=file.path,
            demos=demos,
            lengths=lengths,
            first=first,
            tail_first=tail_first,
            finals=finals,
            obs_keys=obs_keys,
            next_obs={str(k): str(v) for k, v in (meta.get("next_obs") or {}).items()},
            dataset_keys=tuple(meta["dataset_keys"]),
            missing_dataset_keys=tuple(meta.get("missing_dataset_keys") or ()),
            source_dataset_keys=None if source is None else tuple(str(k) for k in source),
            masks={str(k): [str(d) for d in v] for k, v in (meta.get("masks") or {}).items()},
            fields=fields,
        )

    def select(self, filter_by_attribute: str | None) -> np.ndarray:
        """Positions of the demos robomimic loads for this filter, in its order (ValueError if unknown)."""
        if filter_by_attribute is None:
            return np.arange(len(self.demos), dtype=np.int64)
        names = self.masks.get(filter_by_attribute)
        if names is None:
            known = ", ".join(sorted(self.masks)) or "none"
            raise ArgumentError(f"{self.path}: no filter key {filter_by_attribute!r} (its filter keys: {known})")
        where = {d: i for i, d in enumerate(self.demos)}
        missing = [d for d in names if d not in where]
        if missing:
            raise FormatError(f"{self.path}: filter {filter_by_attribute!r} lists demo {missing[0]!r}, which it lacks")
        if len(set(names)) != len(names):
            raise FormatError(f"{self.path}: filter {filter_by_attribute!r} lists a demo twice")
        return np.sort(np.asarray([where[d] for d in names], dtype=np.int64))

    def frame_shape(self, key: str) -> tuple[int, ...]:
        """The shape of one frame of obs key ``key``."""
        return tuple(int(d or 0) for d in self.fields[field_name("obs", key)].shape)
