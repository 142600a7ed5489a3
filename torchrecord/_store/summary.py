"""What a write left out or widened: :class:`WriteSummary`, kept in the metadata and returned.

The writer stores the first :data:`MAX_LISTED` skipped samples (index and error)
and the fields whose shape turned variable under optional metadata keys (see
docs/FORMAT.md); :meth:`WriteSummary.from_metadata` reads them back from any set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_ERROR_CHARS", "MAX_LISTED", "SkippedSample", "WriteSummary"]

#: Skipped samples listed in the metadata (the total is always there).
MAX_LISTED = 1000
#: Characters of each skipped sample's error kept.
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class SkippedSample:
    """One sample left out by ``on_error="skip"``.

    Attributes:
        index: its position in the source (``dataset[index]``, or the index-th
            item of an iterable, or the index-th ``append``).
        error: the first line of the error, ``"ValueError: ..."`` (image files:
            it starts with the file's path).
    """

    index: int
    error: str

    def to_dict(self) -> dict[str, Any]:
        """The skipped sample as plain data (as stored in the metadata)."""
        return {"index": self.index, "error": self.error}


@dataclass(frozen=True)
class WriteSummary:
    """What a write stored, what it left out and which fields turned variable.

    The :class:`~torchrecord.RecordFile` that ``write_record`` or
    ``RecordWriter`` returns holds every skipped sample; one opened from the path
    reads the summary from the metadata, which lists the first 1,000 of them
    (``skipped`` is always the total).

    Attributes:
        count: samples stored.
        skipped: samples left out with ``on_error="skip"``.
        skipped_samples: the skipped samples, in source order.
        variable_fields: field name -> the source index of the first sample whose
            shape differed from the earlier ones', for each field that turned
            variable without being stated in ``schema=`` (each also gave a
            :class:`~torchrecord.errors.VariableShapeWarning`).
    """

    count: int
    skipped: int = 0
    skipped_samples: tuple[SkippedSample, ...] = ()
    variable_fields: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> WriteSummary:
        """The summary a set's metadata keeps (sets written before it: counts only)."""
        listed = meta.get("skipped_samples")
        samples = tuple(
            SkippedSample(int(s["index"]), str(s["error"]))
            for s in (listed if isinstance(listed, list) else [])
            if isinstance(s, dict) and isinstance(s.get("index"), int) and isinstance(s.get("error"), str)
        )
        variable = meta.get("variable_fields")
        fields = (
            {str(k): int(v) for k, v in variable.items() if isinstance(v, int)} if isinstance(variable, dict) else {}
        )
        return cls(_count(meta.get("count")), _count(meta.get("skipped")), samples, fields)

    def metadata(self) -> dict[str, Any]:
        """The metadata keys that keep this summary (bounded)."""
        return {
            "skipped_samples": [s.to_dict() for s in self.skipped_samples[:MAX_LISTED]],
            "variable_fields": dict(self.variable_fields),
        }


def _count(value: Any) -> int:
    """A count from the metadata (0 when absent or not an int)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
