"""How a RecordFile turns a stored value into samples: the wire fast path, else the checked protobuf path.

A record of the usual form (one encoder wrote it) is read by hand from its bytes
(``torchrecord._core.wire``); any other goes through the checked protobuf decoder
(``torchrecord._core.codec``), which reads it the same or raises naming the file,
record and field. A mixin of :class:`~torchrecord._store.record_file.RecordFile`,
so that reading a record costs no call more than the decode itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchrecord._core.codec import decode_leaves
from torchrecord._core.kinds import materialize, sample_builder
from torchrecord._core.schema import Schema
from torchrecord._core.structure import unflatten
from torchrecord._core.wire import WireDecoder

__all__ = ["RecordDecoding"]


class RecordDecoding:
    """The decoding methods of a record file; it needs ``path``, ``schema``, ``samples_per_record``, ``_set_count``."""

    if TYPE_CHECKING:
        path: str

        @property
        def schema(self) -> Schema: ...

        @property
        def samples_per_record(self) -> int: ...

        def _set_count(self) -> int: ...

    def _wire(self) -> WireDecoder | None:
        """The hand reader of this set's records (``torchrecord._core.wire``), or None where it does not apply."""
        schema = self.schema
        cached = self.__dict__.get("_wire_decoder")
        if cached is None or cached[0] is not schema:
            cached = self.__dict__["_wire_decoder"] = (schema, WireDecoder.of(schema) if self._wire_on else None)
        decoder: WireDecoder | None = cached[1]
        return decoder

    #: read records of strings and fixed-shape fields by hand when they have the usual form (tests turn it off)
    _wire_on = True

    def decode(self, value: bytes | memoryview, index: int) -> Any:
        """Decode one stored ``value`` of a set with one sample per record (``index`` names it in errors).

        A record of the usual form is read by the wire fast path (``torchrecord._core.wire``);
        any other goes through the checked protobuf decoder, which reads it the same or raises.
        """
        wire = self._wire()
        if wire is not None:
            leaves = wire.leaves(value)
            if leaves is not None:
                return wire.build(leaves)
        return self._decode_checked(value, index)

    def _decode_checked(self, value: bytes | memoryview, index: int) -> Any:
        """:meth:`decode` through protobuf and the schema checks alone (the slow path)."""
        fields = self.schema.fields
        where = f"{self.path}: record {index}"
        payloads = decode_leaves(value, fields, where)
        leaves = [materialize(p, f, where) for p, f in zip(payloads, fields)]
        return unflatten(self.schema.tree, leaves)

    def decode_record(self, value: bytes | memoryview, record: int, row: int | None = None) -> list[Any]:
        """Decode the stored ``value`` of record ``record`` into the list of samples it holds.

        With ``row``, only that sample of a chunked record is built (a list of one).
        """
        k = self.samples_per_record
        if k == 1:
            return [self.decode(value, record)]
        fields = self.schema.fields
        rows = min(k, self._set_count() - record * k)
        where = f"{self.path}: record {record}"
        wire = self._wire()
        columns = wire.columns(value, rows) if wire is not None else None
        if columns is not None:  # the wire path's lists hold finished leaves, its arrays are materialized below
            ready = [type(c) is list for c in columns]
        else:
            columns = decode_leaves(value, fields, where, rows)
            ready = [False] * len(fields)
        wanted = range(rows) if row is None else [row]
        build = sample_builder(self.schema.tree)
        return [
            build([c[j] if done else materialize(c[j], f, where) for c, f, done in zip(columns, fields, ready)])
            for j in wanted
        ]
