"""A record set converted from a robomimic HDF5 file: what it holds, read back from its metadata.

``torchrecord.convert.from_robomimic`` writes one record per time step, demo
after demo in robomimic's order (a grouped set: group ``g`` is demo ``g``)::

    {"demo": int64 demo position, "obs": {key: frame}, "next_obs": {key: frame},
     <dataset key>: value, ...}

``next_obs`` holds only the keys whose ``next_obs`` is not ``obs`` shifted by one
step. For the others, ``next_obs[t]`` is ``obs[t + 1]`` and the demo's final
``next_obs`` frame is kept in a *tail record*: when any key is stored that way,
the set ends with one more group holding one tail record per demo, in demo
order, with ``"demo": -1``, those frames in ``obs`` and zeros in every other
field. The user metadata ``"robomimic"`` map (this module's :data:`META_KEY`)
describes it all; :class:`RoboSet` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchrecord._core.schema import Field
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, FormatError, VersionError

__all__ = ["DEMO_FIELD", "META_KEY", "RoboSet", "SHIFT", "STORED", "TAIL_DEMO", "VERSION", "field_name"]

#: The user metadata key of the description.
META_KEY = "robomimic"
#: Version of the description (bumped when readers must change).
VERSION = 1
#: The per-record field holding the demo's position (``TAIL_DEMO`` in tail records).
DEMO_FIELD = "demo"
TAIL_DEMO = -1
#: How a key's next_obs is stored: as obs shifted by one step (plus a tail record), or as its own field.
SHIFT = "shift"
STORED = "stored"


def field_name(group: str | None, key: str) -> str:
    """The schema name of an obs (``group="obs"``), next_obs or dataset (``group=None``) key."""
    return key if group is None else f"{group}.{key}"


@dataclass(frozen=True)
class RoboSet:
    """The demos of a converted set and where each frame is stored.

    Attributes:
        path: the record set.
        demos: demo names, in stored (robomimic's) order.
        lengths: frames of each demo (int64).
        first: the stored record of each demo's frame 0 (int64).
        tail_first: the record holding demo 0's final next_obs frame (tail records
            follow in demo order), or None when the set has no tail records.
        obs_keys: observation keys, in stored order.
        next_obs: per obs key, ``SHIFT`` or ``STORED``; empty when the source had no next_obs.
        dataset_keys: dataset keys stored (``actions``...).
        missing_dataset_keys: keys asked for at conversion that no demo had.
        masks: filter key -> demo names.
        fields: schema field name -> Field.
    """

    path: str
    demos: tuple[str, ...]
    lengths: np.ndarray
    first: np.ndarray
    tail_first: int | None
    obs_keys: tuple[str, ...]
    next_obs: dict[str, str]
    dataset_keys: tuple[str, ...]
    missing_dataset_keys: tuple[str, ...]
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
        tails = bool(meta.get("tail_group"))
        expected = len(demos) + (1 if tails else 0)
        if offsets is None or len(offsets) - 1 != expected:
            raise FormatError(f"{file.path}: the groups do not match the {len(demos)} demos its metadata lists")
        first = np.asarray(offsets[: len(demos)], dtype=np.int64)
        if not np.array_equal(np.diff(offsets)[: len(demos)], lengths):
            raise FormatError(f"{file.path}: the demo lengths in the metadata do not match its groups")
        return cls(
            path=file.path,
            demos=demos,
            lengths=lengths,
            first=first,
            tail_first=int(offsets[len(demos)]) if tails else None,
            obs_keys=tuple(meta["obs_keys"]),
            next_obs={str(k): str(v) for k, v in (meta.get("next_obs") or {}).items()},
            dataset_keys=tuple(meta["dataset_keys"]),
            missing_dataset_keys=tuple(meta.get("missing_dataset_keys") or ()),
            masks={str(k): [str(d) for d in v] for k, v in (meta.get("masks") or {}).items()},
            fields={f.name: f for f in file.schema.fields},
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
