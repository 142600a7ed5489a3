"""Optional per-field compression of numeric payloads: the codecs, the writer's choice, the readers' expansion.

A compressed payload is stored in its ``TensorProto``'s ``raw_data`` with
``storage_type`` = ``ZSTD`` (100, a zstd frame) or ``LZ4`` (101, one LZ4 block
without a size prefix); the uncompressed size follows from ``dims`` and the
dtype. Each record says for itself whether a field is compressed, so a record
whose payload did not shrink is stored raw (see docs/FORMAT.md).

The codecs come from cramjam (the ``compress`` extra): one small wheel with both
codecs, and ``decompress_into`` for each, which writes straight into a slice of
the reader's window buffer (no intermediate bytes object). A set with
compressed fields has format version 2, so older readers refuse it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrecord._core.extras import install_hint
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord.errors import ArgumentError, ArgumentTypeError, CorruptRecordError, MissingDependencyError

__all__ = [
    "CODECS",
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
    "decompress_into",
    "has_compression",
    "parse_option",
    "require",
]

#: Codec name -> the ``storage_type`` value that marks a payload compressed with it.
CODECS: dict[str, int] = {"zstd": 100, "lz4": 101}
_BY_STORAGE = {code: name for name, code in CODECS.items()}
_RAW = int(pb.TensorProto.StorageType.RAW)

#: What to install for compression.
EXTRA_HINT = install_hint("compress")
#: A field whose compressed size is above this fraction of its raw size is left alone.
RATIO_LIMIT = 0.9
#: A field's choice is made once this many raw bytes of it, or this many records, were tried.
PROBE_BYTES = 256 << 10
PROBE_RECORDS = 16
_MIN_CRAMJAM = (2, 11)
#: zstd level when none is given (cramjam's own default, 11, is much slower to write).
ZSTD_DEFAULT_LEVEL = 3
#: The most raw bytes one stored byte can expand to, per codec: an LZ4 block's match lengths grow by
#: 255 per extension byte; a zstd block of 3 header bytes and 1 RLE byte holds up to 128 KiB. A payload
#: that claims more (its dims against its stored size) is refused before anything is allocated.
MAX_RATIO: dict[str, int] = {"lz4": 256, "zstd": 32768}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def require(what: str) -> Any:
    """The cramjam module, or an ImportError naming the extra to install (``what``: who needs it)."""
    try:
        cramjam = importlib.import_module("cramjam")
    except ImportError as exc:
        raise MissingDependencyError(f"{what} needs cramjam: {EXTRA_HINT}") from exc
    version = tuple(int(p) for p in str(getattr(cramjam, "__version__", "0")).split(".")[:2] if p.isdigit())
    if version < _MIN_CRAMJAM:
        # older releases cannot decompress an LZ4 block without a size prefix into a buffer
        raise MissingDependencyError(f"{what} needs cramjam 2.11 or newer (found {cramjam.__version__}): {EXTRA_HINT}")
    return cramjam


def codec_of_storage(storage_type: int) -> str | None:
    """The codec name of a compressed ``storage_type``, None for any other value."""
    return _BY_STORAGE.get(storage_type)


def parse_option(compression: Any, level: Any) -> dict[str, str] | str | None:
    """Check ``compression=`` and ``compression_level=`` before a write; returns the option as given.

    ``compression``: None, a codec name (every numeric field), or a map of
    field name -> codec name or None. Raises ValueError / TypeError for anything
    else, and ImportError (naming the extra) when cramjam is missing.
    """
    if compression is None:
        if level is not None:
            raise ArgumentError(f"compression_level={level!r} needs compression='zstd' or 'lz4'")
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
                raise ArgumentTypeError(f"compression: a field's codec must be 'zstd', 'lz4' or None, got {value!r}")
    else:
        raise ArgumentTypeError(
            "compression must be None, 'zstd', 'lz4' or a dict of field name -> codec, "
            f"got {type(compression).__name__}"
        )
    for name in names:
        if name not in CODECS:
            raise ArgumentError(f"unknown compression {name!r}; use one of {sorted(CODECS)}")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise ArgumentTypeError(f"compression_level must be an int, got {level!r}")
    if level is not None and "zstd" in names and not -7 <= level <= 22:
        raise ArgumentError(f"compression_level {level} is outside zstd's levels -7 .. 22")
    if level is not None and "lz4" in names and not 1 <= level <= 12:
        raise ArgumentError(f"compression_level {level} is outside LZ4's high-compression levels 1 .. 12")
    if names:
        require("compression")
    return compression if isinstance(compression, str) else dict(compression)


def _compress(cramjam: Any, codec: str, data: Any, level: int | None) -> bytes:
    if codec == "zstd":
        return bytes(cramjam.zstd.compress(data, level=ZSTD_DEFAULT_LEVEL if level is None else level))
    if level is None:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    return bytes(cramjam.lz4.compress_block(data, mode="high_compression", compression=level, store_size=False))


def decompress_into(cramjam: Any, codec: str, data: Any, out: Any) -> int:
    """Decompress ``data`` into the writable buffer ``out``; returns the bytes written (raises cramjam's errors)."""
    if codec == "zstd":
        return int(cramjam.zstd.decompress_into(data, out))
    return int(cramjam.lz4.decompress_block_into(data, out))


def zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame's header states, None when it states none (or is not a frame)."""
    head = bytes(data[:18])
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        return None
    descriptor = head[4]
    single_segment = descriptor >> 5 & 1
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    dict_bytes = (0, 1, 2, 4)[descriptor & 3]
    at = 5 + (0 if single_segment else 1) + dict_bytes
    if fcs_bytes == 0 or len(head) < at + fcs_bytes:
        return None
    value = int.from_bytes(head[at : at + fcs_bytes], "little")
    return value + 256 if fcs_bytes == 2 else value


def check_expansion(codec: str, data: Any, size: int, where: str) -> None:
    """CorruptRecordError unless ``data`` (``codec``) can expand to ``size`` bytes: called before allocating.

    A zstd frame that states its content size must state ``size``; any payload
    claiming more than :data:`MAX_RATIO` times its stored bytes is damaged or crafted.
    """
    if codec == "zstd":
        stated = zstd_content_size(data)
        if stated is not None and stated != size:
            raise CorruptRecordError(
                f"{where}: its zstd frame holds {stated} bytes, its shape needs {size}; run torchrecord.verify"
            )
    if size > len(data) * MAX_RATIO[codec]:
        raise CorruptRecordError(
            f"{where}: its shape needs {size} bytes, more than {len(data)} bytes of {codec} data can expand to "
            f"(at most {MAX_RATIO[codec]} times); run torchrecord.verify"
        )


def decompress(storage_type: int, data: bytes, size: int, where: str) -> bytes:
    """The ``size`` raw bytes of a compressed payload; CorruptRecordError (``where`` names the field) if damaged.

    The size is checked against what the payload can expand to before anything is allocated.
    """
    codec = _BY_STORAGE[storage_type]
    check_expansion(codec, data, size, where)
    cramjam = require(f"{where.split(':')[0]}: reading its compressed field")
    out = bytearray(size)
    try:
        written = decompress_into(cramjam, codec, data, out) if size else (0 if not data else -1)
    except Exception as exc:  # cramjam.DecompressionError and friends
        raise CorruptRecordError(f"{where}: its {codec} data is damaged ({exc}); run torchrecord.verify") from None
    if written != size:
        raise CorruptRecordError(
            f"{where}: its {codec} data holds {written} bytes, its shape needs {size}; run torchrecord.verify"
        )
    return bytes(out)


# -- writing ------------------------------------------------------------------------------
@dataclass
class _FieldState:
    """What the writer decided for one field so far."""

    codec: str | None
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
        self._cramjam = require("compression")
        if isinstance(self.option, str):
            self.states = [_FieldState(self.option) for _ in self.names]
        else:
            unknown = sorted(set(self.option) - set(self.names))
            if unknown:
                raise ArgumentError(
                    f"compression names fields the samples do not have: {unknown}; fields: {self.names}"
                )
            self.states = [_FieldState(self.option.get(n)) for n in self.names]

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
                        "compression='zstd' or 'lz4' compresses every numeric field and leaves str and bytes "
                        "fields out"
                    )
                state.codec, state.decided, state.trying = None, True, False
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
            if state.codec is None or not state.trying or proto.storage_type != _RAW:
                continue
            raw = proto.raw_data
            packed = _compress(self._cramjam, state.codec, raw, self.level)
            keep = len(packed) <= RATIO_LIMIT * len(raw)
            state.raw += len(raw)
            state.stored += len(packed) if keep else len(raw)
            state.records += 1
            if keep:
                proto.raw_data = packed
                proto.storage_type = CODECS[state.codec]  # type: ignore[assignment]
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
            level = self.level if self.level is not None or want != "zstd" else ZSTD_DEFAULT_LEVEL
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


def _varint(data: Any, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it (ValueError past 10 bytes or the end)."""
    result = shift = 0
    for _ in range(10):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise _NotCanonical("varint too long")


class Expander:
    """Writes a record of a fixed-layout set with compressed fields into its canonical, uncompressed slot.

    The slot (``layout.length`` bytes of the window buffer) gets the template's
    header bytes and every payload: raw ones copied, compressed ones
    decompressed straight into place. Anything that is not the writer's
    canonical encoding raises ValueError, and the caller decodes that record
    the checked slow way (which names file, record and field on damage).
    """

    def __init__(self, layout: Any) -> None:
        self._cramjam = require(f"reading a compressed field of {layout.fields[0].name!r}'s record set")
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
            start = _varint(before, 1)[1]
            storage = len(before) - 3 - max(1, -(-size.bit_length() // 7))
            assert before[storage : storage + 3] == b"\x60\x02\x6a", "not the writer's canonical layout"
            self.fields.append((before[start:storage], off, size))
        self.tail = (position, header[taken:])
        self.length = layout.length

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_cramjam"}  # a module does not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cramjam = require("reading a compressed record set")

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
        cramjam = self._cramjam
        for prefix, off, size in self.fields:
            if data[pos] != 0x0A:
                raise _NotCanonical("not a canonical record")
            sub_length, pos = _varint(data, pos + 1)
            sub_end = pos + sub_length
            n = len(prefix)
            if data[pos : pos + n] != prefix or data[pos + n] != 0x60:
                raise _NotCanonical("not a canonical record")
            storage = data[pos + n + 1]
            if data[pos + n + 2] != 0x6A:
                raise _NotCanonical("not a canonical record")
            stored, pos = _varint(data, pos + n + 3)
            if pos + stored != sub_end or sub_end > end:
                raise _NotCanonical("not a canonical record")
            payload = data[pos:sub_end]
            if storage == _RAW:
                if stored != size:
                    raise _NotCanonical("wrong payload size")
                slot[off : off + size] = payload
            else:
                codec = _BY_STORAGE.get(storage)
                if codec is None:
                    raise _NotCanonical("unknown storage type")
                try:
                    written = decompress_into(cramjam, codec, payload, slot[off : off + size])
                except Exception as exc:  # damaged: the checked path names the field
                    raise _NotCanonical(str(exc)) from None
                if written != size:
                    raise _NotCanonical("wrong decompressed size")
            pos = sub_end
        if pos != end:
            raise _NotCanonical("not a canonical record")


def has_compression(fields: Sequence[Any]) -> bool:
    """True when some schema field may hold compressed records."""
    return any(getattr(f, "compression", None) for f in fields)
