"""RecordSet: what every reader relies on of a set of samples on disk, a single file or a sharded set.

A record set is read through one small contract, whatever stores it:

* its description: ``path``, ``metadata``, ``schema``, ``user_metadata``,
  ``write_summary``, ``set_id``, ``samples_per_record``, ``num_records``,
  ``size_bytes``, ``len()`` and :meth:`RecordSet.read_header` (read and check
  the description without keeping anything open);
* random access and iteration: ``rs[i]``, ``rs[a:b]``, ``rs[[i, j]]``,
  ``__getitems__``, ``iter(rs)``, :meth:`RecordSet.raw`,
  :meth:`RecordSet.decode`, :meth:`RecordSet.decode_record`;
* its files: ``num_shards``, ``shard_offsets`` and :meth:`RecordSet.shard`,
  which is always a :class:`~torchrecord.RecordFile` (the one place where a
  reader gets an LMDB environment), with :meth:`RecordSet.prefetch` and
  :meth:`RecordSet.release` around a reader's use of them;
* groups (``groups``, ``num_groups``, :meth:`RecordSet.group`), closing
  (:meth:`RecordSet.close`, ``with``), and pickling into DataLoader workers.

:class:`~torchrecord.RecordFile` (one file) and
:class:`~torchrecord.ShardedSet` (a folder, manifest or URL of shards)
implement it; :func:`torchrecord.open_set` opens either from a path. This
module also knows which paths name a sharded set rather than one file, so that
``RecordFile`` can refuse them without importing the sets layer.
"""

from __future__ import annotations

import abc
import operator
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Schema
from torchrecord._store.subset import position as subset_position
from torchrecord._store.summary import WriteSummary
from torchrecord.errors import ArgumentTypeError, IndexOutOfRangeError, NotARecordSetError

__all__ = ["MANIFEST_NAME", "RecordSet", "is_sharded", "is_url", "not_one_file"]

#: The file that makes a folder (or a URL prefix) a sharded set.
MANIFEST_NAME = "manifest.json"


def is_url(path: str) -> bool:
    """True for ``scheme://...`` (``file://`` included)."""
    return "://" in path


def is_sharded(path: str) -> bool:
    """True for a URL, a directory, or a path to a manifest file: a sharded set's location, not one file."""
    return is_url(path) or os.path.isdir(path) or os.path.basename(path) == MANIFEST_NAME


def _holds_shards(folder: str) -> bool:
    """True when ``folder`` holds shard files (``shard-IIIII-of-NNNNN.tr``, see ``_shards.manifest``)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n.startswith("shard-") and "-of-" in n and n.endswith(".tr") for n in names)


def not_one_file(path: str) -> NotARecordSetError:
    """The error for ``path`` given as one record-set file when it names a sharded set (see :func:`is_sharded`).

    A folder of shards without its manifest (never finalized) says so; a folder
    that holds no set at all says what it holds instead.
    """
    how = (
        f"open it with torchrecord.open_set({path!r}), or give the path to the reader "
        "(RecordDataset, MixedDataset, load, verify, the command line) directly"
    )
    if is_url(path):
        return NotARecordSetError(f"{path}: is a URL, read as a sharded set, not one record-set file: {how}")
    if os.path.basename(path) == MANIFEST_NAME and not os.path.isdir(path):
        return NotARecordSetError(f"{path}: is a sharded set's manifest, not one record-set file: {how}")
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return NotARecordSetError(
            f"{path}: is a sharded set (a folder with {MANIFEST_NAME}), not one record-set file: {how}"
        )
    if _holds_shards(path):
        return NotARecordSetError(
            f"{path}: is a directory of shards without {MANIFEST_NAME}: the set was never finalized; "
            "run torchrecord.finalize_shards on it (it names any missing shard), then open it with "
            "torchrecord.open_set"
        )
    from torchrecord._store.opening import describe_directory

    return NotARecordSetError(f"{path}: is a directory{describe_directory(path)}")


class RecordSet(abc.ABC):
    """A set of samples on disk, read-only: one file, or a sharded set read as one.

    The contract every reader relies on (see the module docstring).
    ``rs[i]`` is the i-th sample (negative indices count from the end);
    ``rs[2:10]`` and ``rs[[1, 5, 9]]`` (or an integer array) give lists of
    samples, and so does ``__getitems__``, which a map-style DataLoader calls
    once per batch. Iteration walks the samples in stored order. A set pickles
    small (its location and identity), opens lazily in the process that reads,
    and :meth:`close` (or leaving a ``with`` block) lets go of what it holds
    open; it stays usable and opens again on next use.

    Open one with :func:`torchrecord.open_set`; :class:`~torchrecord.RecordFile`
    and :class:`~torchrecord.ShardedSet` implement it.

    Attributes:
        path: where the set is (a file, a folder, a manifest or a URL), as given.
    """

    path: str

    # -- description ---------------------------------------------------------------
    @abc.abstractmethod
    def read_header(self) -> dict[str, Any]:
        """Read and check the set's description (metadata or manifest) now; returns the metadata.

        Raises what the first real use would (a missing path, not a record set, a
        newer version, a damaged file or manifest...), and leaves nothing open
        that was not open before: for checking a path in a process that will not read.
        """

    @property
    @abc.abstractmethod
    def metadata(self) -> dict[str, Any]:
        """The metadata map (format version, count, schema, seed, user metadata...)."""

    @property
    @abc.abstractmethod
    def schema(self) -> Schema:
        """The field schema: names, kinds, dtypes and shapes."""

    @property
    @abc.abstractmethod
    def set_id(self) -> str:
        """The set's identity (uuid4 hex for a file; derived from its shards' for a sharded set)."""

    @property
    @abc.abstractmethod
    def samples_per_record(self) -> int:
        """Samples stored in each LMDB value (1 unless written with ``samples_per_record``)."""

    @property
    @abc.abstractmethod
    def num_records(self) -> int:
        """LMDB values in the whole set (all shards together)."""

    @property
    @abc.abstractmethod
    def size_bytes(self) -> int:
        """Bytes on disk (every shard's together)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Samples in the set (in its subset, if it has one)."""

    def fixed_layout(self) -> FixedLayout | None:
        """The fixed byte layout every record of the set shares, or None (not a fixed schema).

        Worked out once per set and process (it probes the first record's shape against the
        set's size); it does not travel when the set is pickled.
        """
        key = (self.set_id, self.samples_per_record)
        cached: tuple[Any, FixedLayout | None] | None = self.__dict__.get("_fixed_layout")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_fixed_layout"] = (key, FixedLayout.of_file(self))
        return cached[1]

    @property
    def subset(self) -> range | np.ndarray | None:
        """The selected sample indices in order (a range or a read-only int64 array), or None for all."""
        return None

    @property
    def user_metadata(self) -> dict[str, Any]:
        """The ``metadata=`` dict given to the writer."""
        return dict(self.metadata.get("user") or {})

    @property
    def write_summary(self) -> WriteSummary:
        """What the write stored, skipped and widened (see :class:`~torchrecord.WriteSummary`).

        The set that ``write_record`` or ``RecordWriter`` returns holds every
        skipped sample; one opened from the path reads the first 1,000 from the metadata.
        """
        summary = self.__dict__.get("_write_summary")  # set by the writer that returned this object
        return summary if isinstance(summary, WriteSummary) else WriteSummary.from_metadata(self.metadata)

    # -- access ----------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        """``rs[i]``: one sample; ``rs[a:b:c]``, ``rs[[i, j]]``, ``rs[int_array]``: a list of samples.

        Raises TypeError for indices that are not integers (``rs[1.9]``,
        ``rs["3"]``, ``rs[True]``) and IndexError outside the set (or subset).
        """
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(len(self))))
        if isinstance(index, (list, tuple)) or getattr(index, "ndim", 0) > 0:
            return self.__getitems__(index)
        return self._sample(subset_position(index, len(self), self.path))

    @abc.abstractmethod
    def _sample(self, position: int) -> Any:
        """The sample at ``position`` (in range, counted in the subset if there is one)."""

    @abc.abstractmethod
    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples at ``indices`` (positions in the subset, if any); a DataLoader calls it per batch."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Any]:
        """The samples in stored order (the subset's order, if any)."""

    @abc.abstractmethod
    def raw(self, record: int) -> bytes:
        """The stored bytes of record ``record`` (records of all shards counted on, in order)."""

    @abc.abstractmethod
    def decode(self, value: bytes | memoryview, index: int) -> Any:
        """Decode the stored ``value`` of record ``index`` of a set with one sample per record."""

    @abc.abstractmethod
    def decode_record(self, value: bytes | memoryview, record: int, row: int | None = None) -> list[Any]:
        """Decode the stored ``value`` of record ``record`` into the samples it holds (``row``: only that one)."""

    def _positions(self, indices: Any) -> np.ndarray:
        """Positions given by the user (ints, negative from the end) as int64 positions in range, checked."""
        if isinstance(indices, range):
            positions = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            if hasattr(indices, "detach"):
                indices = indices.detach().cpu().numpy()
            arr = np.asarray(indices)
            if arr.dtype == np.bool_ or (len(arr) and not np.issubdtype(arr.dtype, np.integer)) or arr.ndim != 1:
                raise ArgumentTypeError(
                    f"{self.path}: sample indices must be a list or 1-d array of ints, got {arr.dtype} values of shape "
                    f"{arr.shape}; for a mask use numpy.flatnonzero(mask)"
                )
            positions = arr.astype(np.int64)
        n = len(self)
        positions = np.where(positions < 0, positions + n, positions)
        bad = np.flatnonzero((positions < 0) | (positions >= n))
        if len(bad):
            wrong = int(np.asarray(indices)[bad[0]])
            raise IndexOutOfRangeError(f"sample index {wrong} out of range for {self.path} with {n} samples")
        return positions

    # -- files -------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def num_shards(self) -> int:
        """Files in the set (1 for a single file)."""

    @property
    @abc.abstractmethod
    def shard_offsets(self) -> np.ndarray:
        """int64[num_shards + 1]: shard ``s`` holds samples ``offsets[s] .. offsets[s+1]-1``."""

    @abc.abstractmethod
    def shard(self, s: int) -> RecordSet:
        """Shard ``s`` as a :class:`~torchrecord.RecordFile` (a single file is its own shard 0; subclasses
        declare the type, which this module cannot name: ``record_file`` builds on it)."""

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, index in that shard) of sample ``index`` (in range)."""
        offsets = self.shard_offsets
        s = int(np.searchsorted(offsets, index, side="right")) - 1
        return s, index - int(offsets[s])

    def prefetch(self, plan: Sequence[int]) -> None:
        """The shards (``plan``) this process will read, in order (a remote set fetches them ahead).

        Args:
            plan: shard indices in the order they will be read.
        """
        return None  # nothing to fetch ahead (one file, or shards on disk)

    def release(self, s: int) -> None:
        """This process has finished with shard ``s`` for now (a remote cache may evict it).

        Args:
            s: the shard.
        """
        return None  # nothing to evict (one file, or shards on disk)

    # -- groups ------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def groups(self) -> np.ndarray | None:
        """Group offsets int64[G+1] of a grouped set (``write_record(group_by=...)``), or None.

        Group ``g`` is samples ``groups[g] .. groups[g+1]-1`` in stored order.
        """

    @property
    def num_groups(self) -> int:
        """The number of groups G (0 for a set written without ``group_by``)."""
        offsets = self.groups
        return 0 if offsets is None else len(offsets) - 1

    def group(self, g: int) -> list[Any]:
        """The samples of group ``g`` in stored order (negative ``g`` counts from the end).

        Raises IndexError when ``g`` is out of range, which is every ``g`` for a
        set without groups.

        Args:
            g: the group index.
        """
        g = _integer(g, "group index", self.path)
        offsets = self.groups
        n = 0 if offsets is None else len(offsets) - 1
        position = g + n if g < 0 else g
        if offsets is None or not 0 <= position < n:
            what = "it has no groups (written without group_by)" if offsets is None else f"it has {n} groups"
            raise IndexOutOfRangeError(f"group index {g} out of range for {self.path}: {what}")
        return self._read_range(int(offsets[position]), int(offsets[position + 1]))

    @abc.abstractmethod
    def _read_range(self, lo: int, hi: int) -> list[Any]:
        """Samples [lo, hi) of the whole set (not the subset) in stored order."""

    # -- lifecycle ---------------------------------------------------------------------
    @abc.abstractmethod
    def _require_check(self, check: str | None) -> None:
        """Turn on ``check`` (``"structure"``) for this set: a reader was given it with ``check=``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of the open files (the set stays usable: it opens them again on next use)."""

    @abc.abstractmethod
    def _let_go(self, hard: bool) -> None:
        """A reader's pass ended: give back the open files (``hard``: as :meth:`close` does).

        Not hard: a file stays in the process's small cache of idle files, so the
        next use finds it (and its snapshot) again.
        """

    def __enter__(self) -> RecordSet:
        self.read_header()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _integer(value: Any, what: str, path: str) -> int:
    """``value`` as an int; TypeError for floats, strings and bools (which ``int()`` would take)."""
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{path}: {what} {value!r} is a bool, not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{path}: {what} {value!r} ({type(value).__name__}) is not an integer") from None
