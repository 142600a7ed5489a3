"""Admission of samples into a write: the schema, the error policy, the group check.

Every sample the source gave is merged into the :class:`Schema` (the first one
defines it); a sample the source failed to give is an error naming its index
(``on_error="raise"``) or is left out and counted (``"skip"``). With a
:class:`GroupTracker`, each admitted sample's group key is checked too.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from torchrecord._grouping import GroupTracker
from torchrecord._sources import Encoded, Failed, Item, Normalized, Outcome
from torchrecord.errors import SchemaError, SourceError
from torchrecord.schema import Schema

__all__ = ["Admission", "ON_ERROR"]

#: The accepted values of ``on_error``.
ON_ERROR = ("raise", "skip")


class Admission:
    """Decides which samples go into the set; holds the schema and the skip count.

    Args:
        target: the record set being written (named in errors).
        on_error: ``"raise"`` or ``"skip"``.
        samples_per_record: chunked records need fixed shapes, checked here.
        groups: checks and counts the group of each admitted sample, or None.
        source: how errors name where samples come from (``"the source"``).
    """

    def __init__(
        self,
        target: str,
        on_error: str,
        samples_per_record: int,
        groups: GroupTracker | None = None,
        source: str = "the source",
    ) -> None:
        self.target = target
        self.on_error = on_error
        self.chunk = samples_per_record
        self.groups = groups
        self.source = source
        self.schema: Schema | None = None
        self.skipped = 0

    def check(self, stream: Iterator[Item | Encoded]) -> Iterator[bytes | Normalized | Encoded]:
        """The admitted samples of a stream, in order; raises for a failure under ``"raise"``.

        Finished record bytes come from the fast encoder, which only accepts
        samples identical in structure, dtypes and shapes to the first one, so
        they leave the schema as it is.
        """
        track = self.groups.add if self.groups is not None else None
        for item in stream:
            if isinstance(item, Encoded):  # batches come only from ungrouped reads
                assert track is None, "a grouped read gives one sample at a time"
                yield item
                continue
            index, outcome, key = item
            if isinstance(outcome, bytes):
                if track is not None:
                    track(index, key)
                yield outcome
                continue
            admitted = self.admit(index, outcome, key)
            if admitted is not None:
                yield admitted

    def admit(self, index: int, outcome: Outcome, key: Hashable = None) -> bytes | Normalized | None:
        """One sample: the sample to store, None if skipped; raises under ``"raise"``."""
        if isinstance(outcome, Failed):
            self._failed(index, outcome)
            return None
        if isinstance(outcome, Normalized):
            if self.schema is None:
                self.schema = Schema.from_first(outcome.tree, outcome.signatures)
            else:
                self.schema.merge(outcome.tree, outcome.signatures, f"{self.target}: sample {index}")
                if self.chunk > 1:
                    self._require_fixed(index)
        if self.groups is not None:
            self.groups.add(index, key)
        return outcome

    def _failed(self, index: int, outcome: Failed) -> None:
        if outcome.fatal:
            raise SourceError(
                f"{self.target}: the source generator raised at sample {index}: {outcome.message}\n"
                "(a generator cannot go on after raising, so the sample cannot be skipped)\n"
                f"{outcome.detail}"
            )
        if self.on_error == "skip":
            self.skipped += 1
            return
        raise SourceError(
            f"{self.target}: {self.source} failed at sample {index}: {outcome.message}\n"
            f"(pass on_error='skip' to leave bad samples out)\n{outcome.detail}"
        )

    def _require_fixed(self, index: int) -> None:
        assert self.schema is not None
        for fld in self.schema.fields:
            if fld.is_numeric and not fld.is_fixed:
                raise SchemaError(
                    f"{self.target}: sample {index}, field {fld.name!r}: its shape differs from earlier "
                    f"samples'; chunked records (samples_per_record={self.chunk}) need fixed shapes, "
                    "use samples_per_record=1 for variable shapes"
                )
