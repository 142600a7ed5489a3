"""WebDataset sources: tar shards whose members ``<key>.<ext>`` make one sample per key.

As WebDataset groups them: a member's key is its path up to the first dot of
its file name, the rest is the extension (``a/b/x.seg.png`` is key ``a/b/x``,
extension ``seg.png``), and the consecutive members of one key are one sample.
The sample is ``{"__key__": key, <ext>: value, ...}``: every extension's bytes
as they are (images stay encoded: decode them after shuffling with
:func:`torchrecord.transforms.decode_image`, ``key="jpg"``), except ``.cls``
(and ``.cls2``, ``.index``), decoded to an ``int``, and ``.json``, decoded with
``json.loads`` (objects become nested fields, so every sample's JSON needs the
same keys and value types). Every sample needs the same extensions.

Local uncompressed tars are indexed (member offsets) and read at random: the
set is shuffled without a spool, read in ``num_workers`` processes, and
sharded by positions. Compressed tars (``.tar.gz``...) and URLs (``http(s)://``,
``file://``, anything fsspec opens: the ``remote`` extra) are streamed in
order, as one stream; with ``shard``/``num_shards`` shard ``i`` reads the
tars ``i, i + n, ...``.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._core.extras import REMOTE_HINT
from torchrecord._store.record_file import RecordFile
from torchrecord._write.fastwrite import BytesColumn
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import Converter, ConvertOptions, Probe, Target, write
from torchrecord.errors import ArgumentError, MissingDependencyError, SourceError

__all__ = ["TarSamples", "WEBDATASET", "decode_member", "from_webdataset", "split_key"]

_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext (a dot in the file name)
_INTS = ("cls", "cls2", "index")


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a tar member name, as WebDataset splits it; None for a name without a dot."""
    match = _KEY.match(name)
    return (match.group(1), match.group(2)) if match else None


def decode_member(where: str, ext: str, data: bytes) -> Any:
    """A member's value: ``.cls`` (``.cls2``, ``.index``) as int, ``.json`` decoded, any other as bytes."""
    last = ext.rsplit(".", 1)[-1].lower()
    try:
        if last in _INTS:
            return int(data.decode("utf-8").strip())
        if last == "json":
            return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"{where}: .{ext} is not {'an int' if last in _INTS else 'JSON'} ({exc})") from None
    return data


def _is_url(source: str) -> bool:
    return "://" in source


def _local(source: str) -> bool:
    """A local tar that can be read at random: no URL, no compression."""
    if _is_url(source):
        return False
    with open(source, "rb") as f:
        head = f.read(6)
    return not head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd"))


def _open(source: str) -> IO[bytes]:
    if not _is_url(source):
        return open(source, "rb")
    try:
        import fsspec
    except ImportError as exc:
        raise MissingDependencyError(f"{source}: reading a URL needs fsspec: {REMOTE_HINT}") from exc
    try:
        return fsspec.open(source, "rb").open()  # type: ignore[no-any-return]
    except ImportError as exc:  # http(s) without aiohttp
        raise MissingDependencyError(f"{source}: {exc}; {REMOTE_HINT}") from exc
    except OSError as exc:
        raise SourceError(f"{source}: cannot open it ({exc})") from None


def _members(source: str, tar: tarfile.TarFile) -> Iterator[tuple[str, str, tarfile.TarInfo]]:
    """``(key, ext, member)`` of every file member of a tar, in order (hidden and key-less names left out)."""
    try:
        for member in tar:
            if not member.isfile():
                continue
            parts = split_key(member.name)
            if parts is None or os.path.basename(member.name).startswith("."):
                continue
            yield parts[0], parts[1], member
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SourceError(f"{source}: not a readable tar file ({exc})") from None


#: one sample's members: (extension, data offset, size) in the tar
_Entry = tuple[str, int, str, list[tuple[str, int, int]]]

_BLOCK = 512
_FILE_TYPES = (b"0", b"\0", b"7")  # regular file (old and new style), contiguous file: what tarfile calls isfile()
#: header types whose members this reader cannot place by itself: tarfile indexes the whole tar instead
_TARFILE_TYPES = (b"g", b"S", b"M", b"V")  # pax global header, GNU sparse, multi-volume, volume label


def _number(field: bytes) -> int:
    """A header's numeric field: octal digits (NUL/space padded), or GNU base-256 (first byte 0x80 or 0xff)."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (256 ** (len(field) - 1)) if field[:1] == b"\xff" else value
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _text(field: bytes) -> str:
    """A NUL-terminated name field, decoded as tarfile decodes it (UTF-8, undecodable bytes escaped)."""
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes, source: str, offset: int) -> dict[str, str]:
    """The records of a pax extended header (``"<length> <key>=<value>\\n"`` each)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        record = data[pos : pos + length]
        if length <= 0 or space < 0 or not record.endswith(b"\n") or b"=" not in record:
            raise SourceError(
                f"{source}: damaged pax header at byte {offset}: cannot parse record {data[pos : pos + 40]!r}"
            )
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _scan(source: str, data: Any) -> list[tuple[str, int, int]] | None:
    """``(name, data offset, size)`` of every file member of the tar ``data`` (a buffer), in order.

    Reads the 512-byte ustar headers directly: POSIX ``prefix`` names, GNU long
    names (``L``) and pax extended headers (``x``: ``path`` and ``size``) are
    followed; other non-file members are passed over. None for a tar that
    tarfile should read (global pax headers, sparse members...); a SourceError naming the file and the byte
    offset for a damaged header (bad checksum) or a tar that ends early. The
    checksums are verified in NumPy, all at once (and before any other error is
    reported: a damaged header is the cause of what follows it).
    """
    total = len(data)
    offset = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    found: list[tuple[str, int, int]] = []
    heads: list[int] = []  # every header's offset
    stored: list[int] = []  # and the checksum it holds
    use_tarfile = False
    try:
        while offset < total:
            header = data[offset : offset + _BLOCK]
            if header.count(0) == _BLOCK:
                break  # the end-of-archive marker
            if len(header) < _BLOCK:
                raise SourceError(
                    f"{source}: the tar ends early: {len(header)} bytes of a 512-byte member header at byte {offset}"
                )
            try:
                checksum = _number(header[148:156])
                size = _number(header[124:136])
            except ValueError:
                raise SourceError(_damaged(source, offset)) from None
            heads.append(offset)
            stored.append(checksum)
            kind = header[156:157]
            if kind in _TARFILE_TYPES:
                use_tarfile = True
                break
            if "size" in pax:
                size = int(pax["size"])
            start = offset + _BLOCK
            end = start + size
            if size < 0 or end > total:
                raise SourceError(
                    f"{source}: the tar ends early: the member whose header is at byte {offset} needs {size} bytes "
                    f"from byte {start}, but the file has {total} bytes"
                )
            offset = start + -(-size // _BLOCK) * _BLOCK
            if kind == b"L":  # GNU long name: the next member's name
                long_name = _text(data[start:end])
                continue
            if kind == b"x":  # pax extended header: the next member's keywords
                pax = _pax(data[start:end], source, start - _BLOCK)
                if any(k.startswith("GNU.sparse") for k in pax) or "hdrcharset" in pax:
                    use_tarfile = True
                    break
                continue
            if kind == b"K":  # GNU long link name: only links use it
                continue
            if long_name is not None:
                name = long_name
            elif "path" in pax:
                name = pax["path"]
            else:
                name = _text(header[0:100])
                prefix = _text(header[345:500]) if header[257:263] == b"ustar\0" else ""
                if prefix:
                    name = prefix + "/" + name
            long_name, pax = None, {}
            if kind in _FILE_TYPES and not name.endswith("/"):  # tarfile: a name ending in / is a directory
                found.append((name, start, size))
    except SourceError:
        bad = _bad_checksum(data, heads, stored)
        if bad is not None:
            raise SourceError(_damaged(source, bad)) from None
        raise
    bad = _bad_checksum(data, heads, stored)
    if bad is not None:
        raise SourceError(_damaged(source, bad))
    return None if use_tarfile else found


def _damaged(source: str, offset: int) -> str:
    return (
        f"{source}: damaged tar header at byte {offset} (its checksum does not match); "
        "the file is not a tar, or it was corrupted"
    )


def _bad_checksum(data: Any, heads: list[int], stored: list[int]) -> int | None:
    """The offset of the first header whose checksum does not match (unsigned or signed sum), or None."""
    if not heads:
        return None
    buffer = np.frombuffer(data, np.uint8)
    at = np.asarray(heads, np.int64)
    want = np.asarray(stored, np.int64)
    step = 4096
    for lo in range(0, len(at), step):
        block = buffer[at[lo : lo + step, None] + np.arange(_BLOCK)].astype(np.int64)
        block[:, 148:156] = 32  # the checksum field counts as spaces
        unsigned = block.sum(axis=1)
        signed = unsigned - 256 * (block > 127).sum(axis=1)
        wanted = want[lo : lo + step]
        bad = np.flatnonzero((wanted != unsigned) & (wanted != signed))
        if len(bad):
            return heads[lo + int(bad[0])]
    return None


def _tar_members(source: str) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of the file members of a local tar: read directly, else by tarfile."""
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise SourceError(f"{source}: not a readable tar file (it is empty)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = _scan(source, data)
    except OSError as exc:
        raise SourceError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    return _tarfile_members(source) if found is None else iter(found)


def _tarfile_members(source: str) -> Iterator[tuple[str, int, int]]:
    try:
        tar = tarfile.open(source, "r:")  # noqa: SIM115  # closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"{source}: not a readable tar file ({exc})") from None
    with tar:
        try:
            found = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise SourceError(f"{source}: not a readable tar file ({exc})") from None
    return iter(found)


def _index(source: str) -> list[_Entry]:
    """Every sample of a local tar: (source, key, [(ext, offset, size), ...]) without reading the data."""
    entries: list[_Entry] = []
    for name, offset, size in _tar_members(source):
        parts = split_key(name)
        if parts is None or os.path.basename(name).startswith("."):
            continue
        key, ext = parts
        if entries and entries[-1][2] == key:
            entries[-1][3].append((ext, offset, size))
        else:
            entries.append((source, len(entries), key, [(ext, offset, size)]))
    return entries


class TarSamples:
    """Map-style dataset over indexed local tars: sample ``i`` read from its members' offsets.

    Each process maps the tars into memory once (pickled without the maps), so
    ``num_workers`` read in parallel; the writer takes the bytes members as
    columns over the maps (the shuffle's gather is then one copy into the records).
    """

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries
        self._maps: dict[str, mmap.mmap] = {}
        self._plan: Any = None

    def __len__(self) -> int:
        return len(self.entries)

    def _map(self, source: str) -> mmap.mmap:
        data = self._maps.get(source)
        if data is None:
            try:
                with open(source, "rb") as f:
                    data = self._maps[source] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise SourceError(f"{source}: cannot read it ({exc})") from None
        return data

    def __getitem__(self, index: int) -> dict[str, Any]:
        source, number, key, members = self.entries[index]
        sample: dict[str, Any] = {"__key__": key}
        data = self._map(source)
        for ext, offset, size in members:
            if offset + size > len(data):
                raise SourceError(f"{source}: sample {number} ({key!r}), .{ext}: the tar ends early")
            sample[ext] = decode_member(f"{source}: sample {number} ({key!r})", ext, data[offset : offset + size])
        return sample

    def _columns_plan(self) -> Any:
        """What the writer's column path needs, made once: None where the samples must be read as rows."""
        if self._plan is None:
            self._plan = False
            first = [ext for ext, _, _ in self.entries[0][3]]
            lasts = [ext.rsplit(".", 1)[-1].lower() for ext in first]
            if len(set(first)) == len(first) and "json" not in lasts and "__key__" not in first:
                sources = sorted({e[0] for e in self.entries})
                if all([ext for ext, _, _ in e[3]] == first for e in self.entries):
                    try:
                        keys = BytesColumn.of([e[2].encode("utf-8") for e in self.entries], text=True)
                    except UnicodeEncodeError:
                        return None
                    where = np.array([sources.index(e[0]) for e in self.entries], np.int64)
                    spans = np.array([[(o, n) for _, o, n in e[3]] for e in self.entries], np.int64)
                    self._plan = (keys, sources, where, spans, lasts)
        return self._plan or None

    def _torchrecord_columns(self, positions: np.ndarray) -> list[Any] | None:
        """Samples at ``positions`` as columns (key, then each member), for the writer (None: read rows)."""
        plan = self._columns_plan()
        if plan is None:
            return None
        keys, sources, where, spans, lasts = plan
        buffers = tuple(np.frombuffer(self._map(s), np.uint8) for s in sources)
        which = where[positions]
        out: list[Any] = [keys.take(positions)]
        for m, last in enumerate(lasts):
            starts, lengths = spans[positions, m, 0], spans[positions, m, 1]
            if last in _INTS:
                views = BytesColumn(buffers, starts, lengths, which=which).views()
                try:
                    out.append(np.array([int(bytes(v).decode("utf-8").strip()) for v in views], np.int64))
                except (ValueError, UnicodeDecodeError):
                    return None  # the rows name the bad member
            else:
                out.append(BytesColumn(buffers, starts, lengths, which=which))
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}


class _TarStream:
    """The samples of tars read in order as streams (compressed tars, URLs); each iteration starts afresh."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for source in self.sources:
            with _open(source) as raw:
                try:
                    tar = tarfile.open(fileobj=raw, mode="r|*")  # noqa: SIM115  # closed by the with below
                except (tarfile.TarError, OSError) as exc:
                    raise SourceError(f"{source}: not a readable tar file ({exc})") from None
                with tar:
                    sample: dict[str, Any] | None = None
                    number = 0
                    for key, ext, member in _members(source, tar):
                        if sample is None or sample["__key__"] != key:
                            if sample is not None:
                                yield sample
                                number += 1
                            sample = {"__key__": key}
                        handle = tar.extractfile(member)
                        assert handle is not None  # a file member
                        sample[ext] = decode_member(f"{source}: sample {number} ({key!r})", ext, handle.read())
                    if sample is not None:
                        yield sample


def _sources(paths_or_urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    items = [paths_or_urls] if isinstance(paths_or_urls, (str, os.PathLike)) else list(paths_or_urls)
    sources = [os.fspath(p) for p in items]
    if not sources:
        raise ArgumentError("from_webdataset needs at least one tar path or URL")
    out = []
    for source in sources:
        if _is_url(source):
            out.append(source)
        elif os.path.isdir(source):
            found = sorted(os.path.join(source, n) for n in os.listdir(source) if ".tar" in n or n.endswith(".tgz"))
            if not found:
                raise SourceError(f"{source}: a folder without tar files")
            out += found
        elif not os.path.exists(source):
            raise SourceError(f"{source}: no such file; check the tar path")
        else:
            out.append(source)
    return out


@spell_out(ConvertOptions)
def from_webdataset(
    paths_or_urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    path: str | os.PathLike[str],
    **options: Unpack[ConvertOptions],
) -> RecordFile:
    """Convert WebDataset tar shards into a record set, one sample per ``__key__`` (see this module).

    Args:
        paths_or_urls: a tar file, a folder of them, a URL, or a list of these
            (read in this order).
        path: the record set to write (a folder with ``num_shards``).
        **options: the write options and ``shard``/``num_shards``
            (:class:`~torchrecord.convert.ConvertOptions`); ``metadata`` is
            stored beside the converter's keys (``source_format``, ``tars``: the
            number of tars read). Streamed tars are dealt out to the shards
            (shard i reads tars i, i + n, ...), so there must be at least
            ``num_shards`` of them.

    Raises:
        SourceError: a tar is missing or damaged, a ``.cls`` or ``.json`` member
            does not decode (naming the tar, sample and key).
        MissingDependencyError: a URL without fsspec (``remote`` extra).
    """
    target = Target.of(path, options, "from_webdataset")
    sources = _sources(paths_or_urls)
    meta = {"source_format": "webdataset", "tars": len(sources)}
    if all(_local(s) for s in sources):
        entries: list[_Entry] = []
        for source in sources:
            entries += _index(source)
        if not entries:
            raise SourceError(f"{sources[0]}{' ...' if len(sources) > 1 else ''}: holds no samples")
        return write(TarSamples(entries), target, meta)
    shard, num_shards = target.shard, target.num_shards
    if shard is not None and num_shards is not None:
        if len(sources) < num_shards:
            raise ArgumentError(
                f"{len(sources)} streamed tars cannot make {num_shards} shards (each shard reads whole tars); "
                "use fewer shards, or local uncompressed tars"
            )
        if 0 <= shard < num_shards:
            sources = sources[shard::num_shards]
    return write(_TarStream(sources), target, meta)


def _is_tar(probe: Probe) -> bool:
    return not probe.is_dir and (probe.head[257:262] == b"ustar" or probe.path.endswith((".tar", ".tar.gz", ".tgz")))


WEBDATASET = Converter(
    "webdataset",
    from_webdataset,
    ".tar shards (a file, or a folder of them): {'__key__': str, <ext>: bytes} per key, .cls as int, .json decoded",
    _is_tar,
    rank=10,
)
