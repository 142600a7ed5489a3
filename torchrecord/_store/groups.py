"""Group offsets on disk: how a grouped record set stores where each group starts.

A grouped set (written with ``group_by``) keeps its samples group by group. The
``meta`` database holds, under :data:`GROUPS_KEY`, the offsets int64[G+1] as
raw little-endian bytes: group ``g`` is samples ``offsets[g] .. offsets[g+1]-1``
in stored order, ``offsets[0] == 0`` and ``offsets[G] == count``. The metadata
map says ``groups: G`` (and ``group_by``); a set without that key is ungrouped.
Readers that do not know groups ignore both and read the samples as usual.
"""

from __future__ import annotations

from typing import Any

import lmdb
import numpy as np

from torchrecord._store import format as _format
from torchrecord.errors import CorruptRecordError

__all__ = ["GROUPS_KEY", "pack_offsets", "read_offsets"]

GROUPS_KEY = b"groups"

_OFFSET = np.dtype("<i8")


def pack_offsets(offsets: np.ndarray) -> bytes:
    """The stored form of group offsets: int64 little-endian, G+1 of them."""
    return np.ascontiguousarray(offsets, dtype=_OFFSET).tobytes()


def read_offsets(env: lmdb.Environment, path: str, meta: dict[str, Any]) -> np.ndarray | None:
    """The checked group offsets of an open record set, or None for an ungrouped set.

    Raises CorruptRecordError naming the file when the metadata announces groups
    but the offsets are missing, of the wrong length, or not a strictly
    increasing run from 0 to the sample count.
    """
    groups = meta.get("groups")
    if groups is None:
        return None
    damaged = f"{path}: the group offsets are damaged"
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 0:
        raise CorruptRecordError(f"{damaged}: metadata groups={groups!r} is not a group count")
    with _format.lmdb_errors(path), env.begin() as txn:
        raw = txn.get(GROUPS_KEY, db=env.open_db(_format.META_DB, create=False))
    if raw is None:
        raise CorruptRecordError(f"{damaged}: the metadata says {groups} groups but the file holds no offsets")
    if len(raw) != (groups + 1) * _OFFSET.itemsize:
        raise CorruptRecordError(
            f"{damaged}: {len(raw)} bytes of offsets, {groups} groups need {(groups + 1) * _OFFSET.itemsize}"
        )
    offsets = np.frombuffer(raw, dtype=_OFFSET).astype(np.int64)
    count = int(meta["count"])
    if offsets[0] != 0 or offsets[-1] != count:
        raise CorruptRecordError(
            f"{damaged}: they run from {offsets[0]} to {offsets[-1]}, not from 0 to the count {count}"
        )
    steps = np.diff(offsets)
    if (steps <= 0).any():
        bad = int(np.argmax(steps <= 0))
        raise CorruptRecordError(
            f"{damaged}: group {bad} runs from {offsets[bad]} to {offsets[bad + 1]} (offsets must increase)"
        )
    return offsets
