"""Tar files read header by header, with every malformed input refused (the WebDataset converter's reader).

One parser serves a local tar (a buffer, mapped: only the headers are read)
and a stream (a compressed tar, a URL: the members' data is read in order).
It follows what tarfile follows: POSIX ``prefix`` names, GNU long names
(``L``) and pax extended headers (``x``: ``path`` and ``size``); it passes over
directories, links, devices, GNU long link names (``K``), volume labels (``V``)
and pax global headers (``g``). Anything else is a :class:`SourceError` naming
the tar, the byte offset of the header and the member: a damaged header (its
checksum does not match, or a size field holds no number), a size that is
negative or too large (a pax ``size=abc``, a 5,000-digit size), a member that
runs past the end of the file, a GNU sparse or multi-volume member (WebDataset
shards hold whole members), a pax header that cannot be parsed.

An end-of-archive marker (a zero block) ends the tar when only zeros follow it;
when a tar header follows (tars joined with ``cat``), reading goes on, as
``tar --ignore-zeros`` does; anything else after it is refused: a tar is never
cut short without a word. Names are only keys: nothing is extracted, so a name
like ``../x.jpg`` or ``/x.jpg`` is a key like any other.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import numpy as np

from torchrecord.errors import SourceError

__all__ = ["Blocks", "Member", "Readable", "bad_checksum", "members"]

BLOCK = 512
_FILE_TYPES = (b"0", b"\0", b"7")  # regular file (old and new style), contiguous file: tarfile's isfile()
_REFUSED = {b"S": "a GNU sparse member", b"M": "a member continued from another volume (a multi-volume archive)"}
_MAX_DIGITS = 20  # a size or a pax record length of more digits is no size (10**20 bytes: 100 exabytes)
_MAX_NAME = 1 << 20  # a long name or a pax header of more bytes is no name


class Readable(Protocol):
    """A stream of bytes: a file, a decompressor, an fsspec file."""

    def read(self, n: int = -1, /) -> bytes: ...


class Member(NamedTuple):
    """A file member: its name, its data's offset and size, and its (first) header's offset."""

    name: str
    offset: int
    size: int
    header: int


class Blocks:
    """A tar read front to back: a buffer (``data``, a mapped local tar) or a stream (``stream``)."""

    def __init__(self, source: str, data: bytes | mmap.mmap | None = None, stream: Readable | None = None) -> None:
        self.source = source
        self.data = data
        self.stream = stream
        self.offset = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from here (fewer at the end of the tar)."""
        if self.data is not None:
            out = self.data[self.offset : self.offset + n]  # bytes, from a map
        else:
            assert self.stream is not None
            parts, left = [], n
            while left > 0:
                part = self._stream_read(left)
                if not part:
                    break
                parts.append(part)
                left -= len(part)
            out = b"".join(parts)
        self.offset += len(out)
        return out

    def skip(self, n: int) -> int:
        """Move ``n`` bytes on (fewer at the end); the number of bytes passed."""
        if self.data is not None:
            passed = max(0, min(n, len(self.data) - self.offset))
            self.offset += passed
            return passed
        passed = 0
        while passed < n:
            part = self.read(min(n - passed, 1 << 20))
            if not part:
                break
            passed += len(part)
        return passed

    def _stream_read(self, n: int) -> bytes:
        assert self.stream is not None
        try:
            return self.stream.read(n)
        except (OSError, EOFError, ValueError) as exc:  # gzip, bz2, lzma and fsspec errors on damaged data
            raise SourceError(f"{self.source}: cannot read it at byte {self.offset} ({exc})") from None


def _where(source: str, at: int, name: str | None) -> str:
    member = f", member {name!r}" if name else ""
    return f"{source}: byte {at}{member}"


def _octal(field: bytes) -> int | None:
    """A header's numeric field: octal digits (NUL/space padded), or GNU base-256 (first byte 0x80 or 0xff)."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (256 ** (len(field) - 1)) if field[:1] == b"\xff" else value
    digits = field.split(b"\0", 1)[0].strip()
    if not digits:
        return 0
    if not digits.isdigit():  # a sign, a space, an underscore: no size (int() would take some of them)
        return None
    try:
        return int(digits, 8)
    except ValueError:  # an 8 or a 9
        return None


def _decimal(text: str | bytes) -> int | None:
    """A pax number: decimal digits only, at most :data:`_MAX_DIGITS` of them; else None."""
    digits = text.encode() if isinstance(text, str) else text
    if not digits or len(digits) > _MAX_DIGITS or not digits.isdigit():
        return None
    return int(digits)


def _text(field: bytes) -> str:
    """A NUL-terminated name field, decoded as tarfile decodes it (UTF-8, undecodable bytes escaped)."""
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _header_name(header: bytes) -> str:
    name = _text(header[0:100])
    prefix = _text(header[345:500]) if header[257:263] == b"ustar\0" else ""
    return f"{prefix}/{name}" if prefix else name


def _checksum_ok(header: bytes) -> bool:
    stored = _octal(header[148:156])
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    signed = unsigned - 256 * sum(1 for c in header[:148] + header[156:] if c > 127)
    return stored in (unsigned, signed)


def _pax(data: bytes, where: str) -> dict[str, str]:
    """The records of a pax extended header (``"<length> <key>=<value>\\n"`` each)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        length = _decimal(data[pos:space]) if space > pos else None
        record = data[pos : pos + length] if length else b""
        if not length or not record.endswith(b"\n") or b"=" not in record:
            raise SourceError(f"{where}: damaged pax header: cannot parse record {data[pos : pos + 40]!r}")
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


class _Walk:
    """The state of one pass over a tar's headers (see :func:`members`)."""

    def __init__(self, blocks: Blocks, check_now: bool) -> None:
        self.blocks = blocks
        self.source = blocks.source
        self.check_now = check_now
        self.heads: list[int] = []  # every header's offset, with the checksum it holds (checked later)
        self.stored: list[int] = []
        self.long_name: str | None = None
        self.pax: dict[str, str] = {}

    def header(self) -> tuple[int, bytes] | None:
        """The next member header and its offset, past end-of-archive markers; None at the end."""
        at = self.blocks.offset
        header = self.blocks.read(BLOCK)
        if header.count(0) == len(header) and len(header) == BLOCK:
            return self._after_zeros(at)
        if not header:
            return None  # the tar ends without its end-of-archive marker, as tarfile accepts
        if len(header) < BLOCK:
            raise SourceError(
                f"{_where(self.source, at, None)}: the tar ends early: {len(header)} bytes of a 512-byte member header"
            )
        return at, header

    def _after_zeros(self, marker: int) -> tuple[int, bytes] | None:
        """After a zero block: the end, or the header of a tar joined on; anything else is refused."""
        while True:
            at = self.blocks.offset
            block = self.blocks.read(BLOCK)
            if block.count(0) == len(block):
                if len(block) < BLOCK:
                    return None  # only zeros to the end
                continue
            if len(block) == BLOCK and _checksum_ok(block):
                return at, block  # another tar joined on: read on
            raise SourceError(
                f"{_where(self.source, at, None)}: {len(block)} bytes that are no tar header follow the "
                f"end-of-archive marker at byte {marker}; the tar is damaged or has something appended"
            )

    def number(self, header: bytes, at: int, field: slice, what: str) -> int:
        value = _octal(header[field])
        if value is None or value < 0:
            if not _checksum_ok(header):
                raise SourceError(_damaged(self.source, at))
            name = _header_name(header)
            raise SourceError(f"{_where(self.source, at, name)}: damaged tar header: the {what} field holds no size")
        return value

    def size(self, header: bytes, at: int, name: str) -> int:
        if "size" not in self.pax:
            return self.number(header, at, slice(124, 136), "size")
        size = _decimal(self.pax["size"])
        if size is None:
            shown = self.pax["size"][:20] + ("..." if len(self.pax["size"]) > 20 else "")
            raise SourceError(
                f"{_where(self.source, at, name)}: its pax header gives size={shown!r}, which is not a size in bytes"
            )
        return size

    def data(self, at: int, name: str, size: int, keep: bool, limit: int | None = None) -> bytes | None:
        """The member's data (``keep``) or nothing, the blocks passed to the next header."""
        if limit is not None and size > limit:
            raise SourceError(f"{_where(self.source, at, name)}: a {size}-byte header; not a tar, or a damaged one")
        start = self.blocks.offset
        padding = -size % BLOCK
        data = self.blocks.read(size) if keep else None
        got = len(data) if data is not None else self.blocks.skip(size + padding)
        if got < size:
            raise SourceError(
                f"{_where(self.source, at, name)}: the tar ends early: the member needs {size} bytes from "
                f"byte {start}, but the tar ends at byte {start + got}"
            )
        if data is not None:
            self.blocks.skip(padding)
        return data

    def name(self, header: bytes) -> str:
        if self.long_name is not None:
            return self.long_name
        return self.pax.get("path") or _header_name(header)


def _damaged(source: str, at: int) -> str:
    return (
        f"{source}: damaged tar header at byte {at} (its checksum does not match); "
        "the file is not a tar, or it was corrupted"
    )


def members(blocks: Blocks, *, data: bool = False) -> Iterator[tuple[Member, bytes | None]]:
    """Every file member of the tar, in order, with its data when ``data`` (read from a stream).

    A buffer's checksums are checked in NumPy once the headers are read (a
    damaged header, found then, is reported before any error it caused); a
    stream's header by header.
    """
    walk = _Walk(blocks, check_now=blocks.data is None)
    try:
        while (next_header := walk.header()) is not None:
            found = _member(walk, *next_header, data)
            if found is not None:
                yield found
    except SourceError:
        bad = bad_checksum(blocks.data, walk.heads, walk.stored) if blocks.data is not None else None
        if bad is not None:
            raise SourceError(_damaged(blocks.source, bad)) from None
        raise
    if blocks.data is not None:
        bad = bad_checksum(blocks.data, walk.heads, walk.stored)
        if bad is not None:
            raise SourceError(_damaged(blocks.source, bad))


def _member(walk: _Walk, at: int, header: bytes, keep: bool) -> tuple[Member, bytes | None] | None:
    """The member of one header (None for a long name, a pax header or a folder)."""
    source, kind = walk.source, header[156:157]
    if walk.check_now and not _checksum_ok(header):
        raise SourceError(_damaged(source, at))
    walk.heads.append(at)
    walk.stored.append(walk.number(header, at, slice(148, 156), "checksum"))
    name = walk.name(header)
    if kind in _REFUSED:
        raise SourceError(f"{_where(source, at, name)}: {_REFUSED[kind]}, which a WebDataset shard cannot hold")
    size = walk.size(header, at, name)
    if kind == b"L":  # GNU long name: the next member's name
        walk.long_name = _text(walk.data(at, name, size, True, _MAX_NAME) or b"")
        return None
    if kind in (b"x", b"g"):  # pax extended header (x: the next member's keywords; g: every member's)
        records = _pax(walk.data(at, name, size, True, _MAX_NAME) or b"", _where(source, at, name))
        if kind == b"x":
            walk.pax = records
        elif "size" in records or "path" in records:
            raise SourceError(f"{_where(source, at, name)}: a pax global header that sets a size or a path")
        return None
    walk.long_name, walk.pax = None, {}
    if kind not in _FILE_TYPES or name.endswith("/"):  # links, folders, devices...; a name ending in / is a folder
        walk.data(at, name, size, False)
        return None
    start = walk.blocks.offset
    return Member(name, start, size, at), walk.data(at, name, size, keep)


def bad_checksum(data: Any, heads: list[int], stored: list[int]) -> int | None:
    """The offset of the first header whose checksum does not match (unsigned or signed sum), or None."""
    if not heads:
        return None
    buffer = np.frombuffer(data, np.uint8)
    at = np.asarray(heads, np.int64)
    want = np.asarray(stored, np.int64)
    step = 4096
    for lo in range(0, len(at), step):
        block = buffer[at[lo : lo + step, None] + np.arange(BLOCK)].astype(np.int64)
        block[:, 148:156] = 32  # the checksum field counts as spaces
        unsigned = block.sum(axis=1)
        signed = unsigned - 256 * (block > 127).sum(axis=1)
        wanted = want[lo : lo + step]
        bad = np.flatnonzero((wanted != unsigned) & (wanted != signed))
        if len(bad):
            return heads[lo + int(bad[0])]
    return None
