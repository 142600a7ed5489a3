"""Admission of samples into a write: the schema, the error policy, the group check.

Every sample the source gave is merged into the :class:`Schema` (the first one
defines it, checked against a stated ``schema=``); a field whose shape changes
without being stated gives a :class:`VariableShapeWarning` once. A sample the
source failed to give is an error naming its index (``on_error="raise"``) or is
left out and recorded (``"skip"``), within ``max_skipped``; a write that keeps no
sample at all is an error. With a :class:`GroupTracker`, each admitted sample's
group key is checked too.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Hashable, Iterator

import numpy as np

from torchrecord._core.dtypes import by_name
from torchrecord._core.schema import LeafSignature, Schema
from torchrecord._core.structure import field_names
from torchrecord._store.summary import MAX_ERROR_CHARS, SkippedSample, WriteSummary
from torchrecord._write.declared import Declared
from torchrecord._write.grouping import GroupTracker
from torchrecord._write.sources import Encoded, Failed, Item, Normalized, Outcome, add_note
from torchrecord.errors import SampleValueError, SchemaError, SourceError, TorchRecordError, VariableShapeWarning

__all__ = ["Admission", "ON_ERROR"]

#: The accepted values of ``on_error``.
ON_ERROR = ("raise", "skip")

_SHOWN_FAILURES = 5


class Admission:
    """Decides which samples go into the set; holds the schema and what was skipped.

    Args:
        target: the record set being written (named in errors).
        on_error: ``"raise"`` or ``"skip"``.
        samples_per_record: chunked records need fixed shapes, checked here.
        groups: checks and counts the group of each admitted sample, or None.
        source: how errors name where samples come from (``"the source"``).
        max_skipped: with ``"skip"``: the most samples (int) or the largest
            fraction of them (float) that may be left out; None: no bound.
        declared: the stated ``schema=``, or None.
    """

    def __init__(
        self,
        target: str,
        on_error: str,
        samples_per_record: int,
        groups: GroupTracker | None = None,
        source: str = "the source",
        *,
        max_skipped: int | float | None = None,
        declared: Declared | None = None,
    ) -> None:
        self.target = target
        self.on_error = on_error
        self.chunk = samples_per_record
        self.groups = groups
        self.source = source
        self.max_skipped = max_skipped
        self.declared = declared
        self.schema: Schema | None = None
        #: the number of samples in the source when known (map-style sources), for a fraction
        self.total: int | None = None
        self.admitted = 0
        self.skipped_samples: list[SkippedSample] = []
        #: field name -> source index of the first sample whose shape differed (unstated fields)
        self.variable_fields: dict[str, int] = {}
        self._first = "the first sample"
        self._lists: set[int] = set()  # positions of fields the first sample gave as lists
        #: the samples come in a shuffled order of source indices (a map-style source read pre-shuffled)
        self.shuffled_read = False

    @property
    def has_lists(self) -> bool:
        """True when the first sample gave a field as a list of numbers (its length may vary by nature)."""
        return bool(self._lists)

    @property
    def skipped(self) -> int:
        return len(self.skipped_samples)

    def summary(self) -> WriteSummary:
        """What was admitted, skipped and widened so far."""
        skipped = tuple(sorted(self.skipped_samples, key=_by_index))  # a shuffled read meets them out of order
        return WriteSummary(self.admitted, self.skipped, skipped, dict(self.variable_fields))

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
                self.admitted += len(item)
                yield item
                continue
            index, outcome, key = item
            if isinstance(outcome, bytes):
                if track is not None:
                    track(index, key)
                self.admitted += 1
                yield outcome
                continue
            admitted = self.admit(index, outcome, key)
            if admitted is not None:
                yield admitted

    def admit(self, index: int, outcome: Outcome, key: Hashable = None) -> bytes | Normalized | None:
        """One sample: the sample to store, None if skipped; raises under ``"raise"``.

        With ``"skip"``, a sample that does not fit the schema (a field that
        changes kind, dtype or rank, another structure, a break of the stated
        ``schema=``) is left out like one the source failed to give, and the
        schema stays as it was.
        """
        if isinstance(outcome, Failed):
            self._failed(index, outcome)
            return None
        if isinstance(outcome, Normalized):
            where = f"{self.target}: sample {index}"
            first = self.schema is None
            try:
                if first:
                    self._establish(index, outcome, where)
                else:
                    self._merge(index, outcome, where)
            except SchemaError as exc:
                if self.on_error != "skip":
                    raise
                self._skip(index, "SchemaError: " + str(exc).removeprefix(where).lstrip(",: "))
                return None
            if first and self.chunk > 1:
                self._require_fixed(index)  # a stated variable shape with chunked records: never skipped
        if self.groups is not None:
            self.groups.add(index, key)
        self.admitted += 1
        return outcome

    def finish(self) -> None:
        """After the last sample: SourceError if nothing was kept or too much was skipped."""
        if self.skipped and not self.admitted:
            self._too_many(f"all {self.skipped} samples failed ({self.skipped} of {self.skipped} skipped), "
                           "so the set would be empty")  # fmt: skip
        if isinstance(self.max_skipped, float) and self.total is None:
            seen = self.admitted + self.skipped
            if self.skipped > self.max_skipped * seen:
                self._too_many(f"{self.skipped} of {seen} samples failed, more than max_skipped={self.max_skipped!r}")

    # -- the schema ------------------------------------------------------------------
    def _establish(self, index: int, sample: Normalized, where: str) -> None:
        # samples are named by their index in the source; a shuffled read meets them out of order
        out_of_order = ": a shuffled write reads the source out of order" if self.shuffled_read and index else ""
        self._first = f"the first sample read (sample {index}{out_of_order})"
        declared = self.declared
        if declared is not None:
            names = [f.name for f in declared.full.fields] if declared.full is not None else field_names(sample.tree)
            if len(names) == len(sample.signatures):
                for i, name in enumerate(names):
                    stated = declared.fields.get(name)
                    if stated is not None and stated.dtype is not None:
                        _adopt_dtype(sample, i, stated.dtype)
            schema = declared.first(sample.tree, sample.signatures, where)
        else:
            schema = Schema.from_first(sample.tree, sample.signatures)
        counts = Counter(schema.names)
        twice = [n for n in schema.names if counts[n] > 1]
        if twice:
            raise SchemaError(
                f"{where}: the field name {twice[0]!r} comes twice after flattening (a key with a dot, "
                "{'a.b': ...}, and a nested {'a': {'b': ...}} both give 'a.b'); rename one of them"
            )
        self._lists = {i for i, sig in enumerate(sample.signatures) if sig.from_list}
        self.schema = schema

    def _merge(self, index: int, sample: Normalized, where: str) -> None:
        schema = self.schema
        assert schema is not None
        if sample.tree == schema.tree and len(sample.signatures) == len(schema.fields):
            for i, sig in enumerate(sample.signatures):
                if sig.from_list:
                    _adopt_dtype(sample, i, schema.fields[i].dtype)
            if self.declared is not None:
                self.declared.check(sample.signatures, where)
        before = list(schema.fields)
        try:
            widened = schema.merge(sample.tree, sample.signatures, where, self._first)
            if widened and self.chunk > 1:
                self._require_fixed(index)
        except SchemaError:
            schema.fields[:] = before  # nothing of a refused sample stays in the schema
            raise
        for i in widened:
            name = before[i].name
            if name in self.variable_fields or i in self._lists or sample.signatures[i].from_list:
                continue
            if self.declared is not None and self.declared.stated(i):
                continue
            self.variable_fields[name] = index
            _warn_variable(where, name, sample.signatures[i], before[i].shape, schema.fields[i].shape, self._first)

    def _require_fixed(self, index: int) -> None:
        assert self.schema is not None
        for fld in self.schema.fields:
            if fld.is_numeric and not fld.is_fixed:
                raise SchemaError(
                    f"{self.target}: sample {index}, field {fld.name!r}: its shape varies ({_dims(fld.shape)}); "
                    f"chunked records (samples_per_record={self.chunk}) need fixed shapes, "
                    "use samples_per_record=1 for variable shapes"
                )

    # -- failures --------------------------------------------------------------------
    def _failed(self, index: int, outcome: Failed) -> None:
        if outcome.fatal:
            raise self._chained(
                SourceError(
                    f"{self.target}: the source generator raised at sample {index}: {outcome.message}\n"
                    "(a generator cannot go on after raising, so the sample cannot be skipped)"
                ),
                outcome,
            )
        if self.on_error != "skip":
            if outcome.invalid:
                raise self._refused(index, outcome)
            raise self._chained(
                SourceError(
                    f"{self.target}: {self.source} failed at sample {index}: {outcome.message}\n"
                    "(pass on_error='skip' to leave bad samples out, with max_skipped= to bound how many "
                    "may be left out, e.g. max_skipped=0.01 for 1%)"
                ),
                outcome,
            )
        self._skip(index, outcome.message)

    def _refused(self, index: int, outcome: Failed) -> TorchRecordError:
        """The library's own error for a sample it cannot store, naming the file and the sample."""
        error = outcome.error
        kind = type(error) if isinstance(error, TorchRecordError) else SampleValueError
        text = str(error) if error is not None else outcome.message
        hint = " (or pass on_error='skip' to leave such samples out)" if self.admitted else ""
        refused = kind(f"{self.target}: sample {index}, {text}{hint}")
        refused.__suppress_context__ = True  # the message says it all: no internal traceback
        return refused

    @staticmethod
    def _chained(error: SourceError, outcome: Failed) -> SourceError:
        """``error`` with the source's exception as its ``__cause__`` (its traceback, not in the text)."""
        if outcome.error is not None:
            error.__cause__ = outcome.error
        else:  # it did not pickle out of a DataLoader worker: its formatted traceback as a note
            add_note(error, outcome.detail.rstrip())
        return error

    def _skip(self, index: int, message: str) -> None:
        """Leave sample ``index`` out and record why; raises when more than ``max_skipped`` are."""
        lines = message.strip().splitlines() or ["(no message)"]
        self.skipped_samples.append(SkippedSample(index, lines[0][:MAX_ERROR_CHARS]))
        bound = self.max_skipped
        if bound is None:
            return
        if isinstance(bound, float):
            if self.total is not None and self.skipped > bound * self.total:
                self._too_many(
                    f"{self.skipped} of {self.total} samples failed, more than max_skipped={bound!r}", midway=True
                )
        elif self.skipped > bound:
            self._too_many(f"{self.skipped} samples failed, more than max_skipped={bound!r}", midway=True)

    def _too_many(self, what: str, midway: bool = False) -> None:
        """SourceError listing the failures by source index; ``midway``: the write stopped before the end."""
        shown = sorted(self.skipped_samples, key=_by_index)[:_SHOWN_FAILURES]
        first = shown[0]
        listed = "\n".join(f"  sample {s.index}: {s.error}" for s in shown)
        more = f"\n  ... and {self.skipped - len(shown)} more" if self.skipped > len(shown) else ""
        if midway and self.shuffled_read:  # the samples met so far are a shuffled pick, not the first ones
            raise SourceError(
                f"{self.target}: {what}; nothing was written (e.g. sample {first.index}: {first.error})\n"
                "the failures met before the write stopped, by source index (the source is read in the "
                "shuffled write order, so other samples, lower ones too, may fail as well):\n"
                f"{listed}{more}\n"
                "fix the source, or raise max_skipped if leaving these samples out is intended"
            )
        raise SourceError(
            f"{self.target}: {what}; nothing was written (first failure: sample {first.index}: {first.error})\n"
            f"the first failures, by source index:\n{listed}{more}\n"
            "fix the source, or raise max_skipped if leaving these samples out is intended"
        )


def _by_index(sample: SkippedSample) -> int:
    return sample.index


def _adopt_dtype(sample: Normalized, i: int, dtype: str) -> None:
    """An empty list of numbers has no dtype of its own: give it its field's."""
    sig = sample.signatures[i]
    if not sig.from_list or sig.dtype == dtype or 0 not in sig.shape or dtype in ("bytes", "str"):
        return
    try:
        info = by_name(dtype)
    except KeyError:
        return
    sample.signatures[i] = LeafSignature(sig.kind, info.name, sig.shape, from_list=True)
    sample.payloads[i] = np.zeros(sig.shape, dtype=info.numpy)


def _warn_variable(
    where: str, name: str, sig: LeafSignature, was: tuple[int | None, ...], now: tuple[int | None, ...], first: str
) -> None:
    warnings.warn(
        f"{where}, field {name!r}: shape {list(sig.shape)} differs from {first}'s {_dims(was)}; the field is "
        f"written with the variable shape {_dims(now)}, so batch mode gives a list for it instead of one "
        f"tensor and the fast path is off. If that is intended, state it: schema={{{name!r}: {_dims(now)}}}; "
        "else fix the source so that every sample has one shape there",
        VariableShapeWarning,
        stacklevel=2,
    )


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"
