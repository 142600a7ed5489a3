"""Optional per-field compression of numeric payloads: the writer's choice and the readers' expansion.

A compressed payload is stored in its ``TensorProto``'s ``raw_data`` with the
codec's ``storage_type`` (``ZSTD`` = 100, a zstd frame; ``LZ4`` = 101, one LZ4
block without a size prefix); the uncompressed size follows from ``dims`` and
the dtype. Each record says for itself whether a field is compressed, so a
record whose payload did not shrink is stored raw (see docs/FORMAT.md).

The codecs themselves are the registry of ``_core/compression`` (one module
each); this module never names one. They come from cramjam (the ``compress``
extra), whose ``decompress_into`` writes straight into a slice of the reader's
window buffer (no intermediate bytes object). A set with compressed fields has
format version 2, so older readers refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrecord._core.compression import BY_STORAGE, CODECS, EXTRA_HINT, CompressionCodec, choices, require
from torchrecord._core.compression.base import Compressor, Decompressor
from torchrecord._core.compression.zstd import zstd_content_size
from torchrecord._core.varint import read_varint, varint_size
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord.errors import ArgumentError, ArgumentTypeError, CorruptRecordError

__all__ = [
    "EXTRA_HINT",
    "Expander",
    "FieldCompressor",
    "MAX_RATIO",
    "PROBE_BYTES",
    "PROBE_RECORDS",
    "RATIO_LIMIT",
    "check_expansion",
    "codec_of_storage",
    "decompress",
    "has_compression",
    "parse_option",
    "require",
    "zstd_content_size",
]

_RAW = int(pb.TensorProto.StorageType.RAW)

#: A field whose compressed size is above this fraction of its raw size is left alone.
RATIO_LIMIT = 0.9
#: A field's choice is made once this many raw bytes of it, or this many records, were tried.
PROBE_BYTES = 256 << 10
PROBE_RECORDS = 16
#: The most raw bytes one stored byte can expand to, per codec (see each codec's module). A payload
#: that claims more (its dims against its stored size) is refused before anything is allocated.
MAX_RATIO: dict[str, int] = {name: codec.max_ratio for name, codec in CODECS.items()}


def codec_of_storage(storage_type: int) -> str | None:
    """The codec name of a compressed ``storage_type``, None for any other value."""
    codec = BY_STORAGE.get(storage_type)
    return None if codec is None else codec.name


def parse_option(compression: Any, level: Any) -> dict[str, str] | str | None:
    """Check ``compression=`` and ``compression_level=`` before a write; returns the option as given.

    ``compression``: None, a codec name (every numeric field), or a map of
    field name -> codec name or None. Raises ValueError / TypeError for anything
    else, and ImportError (naming the extra) when cramjam is missing.
    """
    if compression is None:
        if level is not None:
            raise ArgumentError(f"compression_level={level!r} needs compression={choices(' or ')}")
        return None
    if isinstance(compression, str):
        names = [compression]
    elif isinstance(compression, Mapping):
        for key in compression:
            if not isinstance(key, str):
                raise ArgumentTypeError(f"compression: field names must be str, got {key!r}")
        names = [v for v in compression.values() if v is not None]
        for value in compression.values():
            if value is not None and not isinstance(value, str):
                raise ArgumentTypeError(f"compression: a field's codec must be {choices()} or None, got {value!r}")
    else:
        raise ArgumentTypeError(
            f"compression must be None, {choices()} or a dict of field name -> codec, got {type(compression).__name__}"
        )
    for name in names:
        if name not in CODECS:
            raise ArgumentError(f"unknown compression {name!r}; use one of {sorted(CODECS)}")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise ArgumentTypeError(f"compression_level must be an int, got {level!r}")
    if level is not None:
        for codec in CODECS.values():
            if codec.name in names:
                codec.check_level(level)
    if names:
        require("compression")
    return compression if isinstance(compression, str) else dict(compression)


def check_expansion(codec: str, data: Any, size: int, where: str) -> None:
    """CorruptRecordError unless ``data`` (``codec``) can expand to ``size`` bytes: called before allocating.

    A payload whose header states its raw size (a zstd frame) must state ``size``;
    any payload claiming more than :data:`MAX_RATIO` times its stored bytes is damaged or crafted.
    """
    spec = CODECS[codec]
    stated = spec.stated_size(data)
    if stated is not None and stated != size:
        raise CorruptRecordError(
            f"{where}: its {codec} frame holds {stated} bytes, its shape needs {size}; run torchrecord.verify"
        )
    if size > len(data) * spec.max_ratio:
        raise CorruptRecordError(
            f"{where}: its shape needs {size} bytes, more than {len(data)} bytes of {codec} data can expand to "
            f"(at most {spec.max_ratio} times); run torchrecord.verify"
        )


def decompress(storage_type: int, data: bytes, size: int, where: str) -> bytes:
    """The ``size`` raw bytes of a compressed payload; CorruptRecordError (``where`` names the field) if damaged.

    The size is checked against what the payload can expand to before anything is allocated.
    """
    codec = BY_STORAGE[storage_type]
    check_expansion(codec.name, data, size, where)
    unpack = codec.decompressor(codec.library(f"{where.split(':')[0]}: reading its compressed field"))
    out = bytearray(size)
    try:
        written = unpack(data, out) if size else (0 if not data else -1)
    except Exception as exc:  # cramjam.DecompressionError and friends
        raise CorruptRecordError(f"{where}: its {codec.name} data is damaged ({exc}); run torchrecord.verify") from None
    if written != size:
        raise CorruptRecordError(
            f"{where}: its {codec.name} data holds {written} bytes, its shape needs {size}; run torchrecord.verify"
        )
    return bytes(out)


# -- writing ------------------------------------------------------------------------------
@dataclass
class _FieldState:
    """What the writer decided for one field so far."""

    codec: str | None
    compress: Compressor | None = None  # the codec's function at the write's level
    storage: int = 0  # the codec's storage_type
    raw: int = 0  # raw bytes tried
    stored: int = 0  # bytes stored for them
    records: int = 0
    compressed: int = 0  # records stored compressed
    decided: bool = False
    trying: bool = True  # False once the probe found no gain


@dataclass
class FieldCompressor:
    """Compresses chosen fields of finished records before they are appended.

    Built once the schema is known. Each record is re-encoded with the chosen
    fields' payloads compressed (a payload that does not shrink below
    :data:`RATIO_LIMIT` of its size is stored raw in that record). After
    :data:`PROBE_BYTES` or :data:`PROBE_RECORDS` of a field, a field whose
    overall ratio is above the limit is left alone from then on.
    """

    names: list[str]
    option: dict[str, str] | str
    level: int | None
    states: list[_FieldState] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.option, str):
            asked: list[str | None] = [self.option for _ in self.names]
        else:
            unknown = sorted(set(self.option) - set(self.names))
            if unknown:
                raise ArgumentError(
                    f"compression names fields the samples do not have: {unknown}; fields: {self.names}"
                )
            asked = [self.option.get(n) for n in self.names]
        self.states = [_FieldState(None) if name is None else self._state(CODECS[name]) for name in asked]

    def _state(self, codec: CompressionCodec) -> _FieldState:
        compress = codec.compressor(codec.library("compression"), self.level)
        return _FieldState(codec.name, compress, int(codec.storage_type))

    @classmethod
    def build(cls, fields: Sequence[Any], option: dict[str, str] | str, level: int | None) -> FieldCompressor:
        """A compressor for a schema's ``fields``.

        Only numeric fields are candidates: ``"zstd"`` or ``"lz4"`` for every
        field leaves str and bytes fields out (they are not in the report), and a
        dict that names one is an ArgumentError.
        """
        names = [f.name for f in fields]
        made = cls(names, option, level)
        for state, f in zip(made.states, fields):
            if not f.is_numeric and state.codec is not None:
                if not isinstance(option, str):
                    raise ArgumentError(
                        f"compression: field {f.name!r} is {f.kind}; only numeric fields are compressed "
                        f"(compression={option!r} names it): leave {f.name!r} out of the dict. "
                        f"compression={choices(' or ')} compresses every numeric field and leaves str and bytes "
                        "fields out"
                    )
                state.codec, state.compress, state.decided, state.trying = None, None, True, False
        return made

    @property
    def active(self) -> bool:
        """True while some field is (or may still be) compressed."""
        return any(s.codec is not None and s.trying for s in self.states)

    def apply(self, value: bytes) -> bytes:
        """``value`` (a canonical record) with the chosen fields compressed."""
        if not self.active:
            return value
        msg = pb.TensorProtos.FromString(value)
        changed = False
        for proto, state in zip(msg.protos, self.states):
            if state.compress is None or not state.trying or proto.storage_type != _RAW:
                continue
            raw = proto.raw_data
            packed = state.compress(raw)
            keep = len(packed) <= RATIO_LIMIT * len(raw)
            state.raw += len(raw)
            state.stored += len(packed) if keep else len(raw)
            state.records += 1
            if keep:
                proto.raw_data = packed
                proto.storage_type = state.storage  # type: ignore[assignment]
                state.compressed += 1
                changed = True
            if not state.decided and (state.raw >= PROBE_BYTES or state.records >= PROBE_RECORDS):
                state.decided = True
                state.trying = state.stored <= RATIO_LIMIT * state.raw  # no gain: leave the field alone
        if not changed:
            return value
        return msg.SerializeToString()

    def report(self) -> dict[str, Any]:
        """Per field name: the codec asked, whether records hold compressed data, and the ratio tried."""
        out: dict[str, Any] = {}
        asked = self.option
        for name, state in zip(self.names, self.states):
            want = asked if isinstance(asked, str) else asked.get(name)
            if want is None or state.codec is None:  # not asked for, or not a candidate (a str or bytes field)
                continue
            ratio = round(state.stored / state.raw, 4) if state.raw else None
            level = self.level if self.level is not None else CODECS[want].default_level
            out[name] = {"codec": want, "level": level, "applied": state.compressed > 0, "ratio": ratio}
        return out

    def applied(self) -> dict[str, str]:
        """Field name -> codec, for the fields some record holds compressed."""
        asked = self.option
        return {
            name: (asked if isinstance(asked, str) else asked[name])
            for name, state in zip(self.names, self.states)
            if state.compressed
        }


# -- the fast read path ------------------------------------------------------------------
class _NotCanonical(ValueError):
    """Internal signal, never raised to a user: the record is not the writer's canonical encoding.

    The fast reader catches it (as the ValueError of a wrong-length copy) and
    decodes that record the checked way, which names file, record and field.
    """


class Expander:
    """Writes a record of a fixed-layout set with compressed fields into its canonical, uncompressed slot.

    The slot (``layout.length`` bytes of the window buffer) gets the template's
    header bytes and every payload: raw ones copied, compressed ones
    decompressed straight into place. Anything that is not the writer's
    canonical encoding raises ValueError, and the caller decodes that record
    the checked slow way (which names file, record and field on damage).
    """

    def __init__(self, layout: Any) -> None:
        #: the codecs the schema names (a record holding another is decoded the checked way)
        self.codecs = tuple(sorted({f.compression for f in layout.fields if f.compression in CODECS}))
        self._unpack = _decompressors(
            self.codecs, f"reading a compressed field of {layout.fields[0].name!r}'s record set"
        )
        header = layout.header.tobytes()
        self.pieces: list[tuple[int, bytes]] = []  # (slot position, header bytes before each payload)
        self.fields: list[tuple[bytes, int, int]] = []  # (sub-message prefix, payload offset, payload size)
        position = taken = 0
        for off, size in zip(layout.offsets, (layout.rows * s for s in layout.sample_bytes)):
            before = header[taken : taken + off - position]
            self.pieces.append((position, before))
            taken += off - position
            position = off + size
            # before = [0x0A][varint sub length][dims, data_type][0x60 0x02][0x6A][varint size]
            start = read_varint(before, 1)[1]
            storage = len(before) - 3 - varint_size(size)
            assert before[storage : storage + 3] == b"\x60\x02\x6a", "not the writer's canonical layout"
            self.fields.append((before[start:storage], off, size))
        self.tail = (position, header[taken:])
        self.length = layout.length

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_unpack"}  # a library's function may not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._unpack = _decompressors(self.codecs, "reading a compressed record set")

    def __call__(self, value: Any, slot: Any) -> None:
        """Fill ``slot`` (a writable memoryview of ``length`` bytes) from ``value``; ValueError if not canonical."""
        try:
            self._fill(memoryview(value), slot)
        except IndexError:  # a record cut short
            raise _NotCanonical("record too short") from None

    def _fill(self, data: memoryview, slot: Any) -> None:
        for position, piece in self.pieces:
            slot[position : position + len(piece)] = piece
        tail_at, tail = self.tail
        slot[tail_at : tail_at + len(tail)] = tail
        pos = 0
        end = len(data)
        unpack = self._unpack
        for prefix, off, size in self.fields:
            if data[pos] != 0x0A:
                raise _NotCanonical("not a canonical record")
            sub_length, pos = read_varint(data, pos + 1)
            sub_end = pos + sub_length
            n = len(prefix)
            if data[pos : pos + n] != prefix or data[pos + n] != 0x60:
                raise _NotCanonical("not a canonical record")
            storage = data[pos + n + 1]
            if data[pos + n + 2] != 0x6A:
                raise _NotCanonical("not a canonical record")
            stored, pos = read_varint(data, pos + n + 3)
            if pos + stored != sub_end or sub_end > end:
                raise _NotCanonical("not a canonical record")
            payload = data[pos:sub_end]
            if storage == _RAW:
                if stored != size:
                    raise _NotCanonical("wrong payload size")
                slot[off : off + size] = payload
            else:
                into = unpack.get(storage)
                if into is None:
                    raise _NotCanonical("unknown storage type")
                try:
                    written = into(payload, slot[off : off + size])
                except Exception as exc:  # damaged: the checked path names the field
                    raise _NotCanonical(str(exc)) from None
                if written != size:
                    raise _NotCanonical("wrong decompressed size")
            pos = sub_end
        if pos != end:
            raise _NotCanonical("not a canonical record")


def _decompressors(names: Sequence[str], what: str) -> dict[int, Decompressor]:
    """``storage_type`` -> the function decompressing into a buffer, for the codecs ``names``."""
    codecs = [CODECS[name] for name in names]
    return {int(codec.storage_type): codec.decompressor(codec.library(what)) for codec in codecs}


def has_compression(fields: Sequence[Any]) -> bool:
    """True when some schema field may hold compressed records."""
    return any(getattr(f, "compression", None) for f in fields)
