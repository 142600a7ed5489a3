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

import bz2
import gzip
import io
import json
import lzma
import mmap
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._core.extras import REMOTE_HINT
from torchrecord._store.record_file import RecordFile
from torchrecord._write.fastwrite import BytesColumn
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import Converter, ConvertOptions, Probe, Target, write
from torchrecord.convert.tars import Blocks, Member, Readable, members
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


#: one sample's members: (extension, data offset, size) in the tar
_Entry = tuple[str, int, str, list[tuple[str, int, int]]]


def _samples(source: str, found: Iterable[tuple[Member, Any]]) -> Iterator[tuple[str, list[tuple[str, Member, Any]]]]:
    """Members grouped into samples by key, as WebDataset groups them: ``(key, [(ext, member, data), ...])``.

    Hidden and key-less names are left out. A second member of one key with
    the same extension is refused, as WebDataset refuses it ("duplicate file
    name"), and so is a key that comes back after other keys (WebDataset would
    make two samples of it): each names the tar, the byte offset and the member.
    """
    seen: set[str] = set()
    key: str | None = None
    group: dict[str, tuple[Member, Any]] = {}
    for member, data in found:
        parts = split_key(member.name)
        if parts is None or os.path.basename(member.name).startswith("."):
            continue
        if parts[0] == key:
            if parts[1] in group:
                raise SourceError(
                    f"{_at(source, member)}: a second .{parts[1]} for key {key!r} (the first is the member at "
                    f"byte {group[parts[1]][0].header}); WebDataset refuses it too (duplicate file name): rename "
                    "or remove one"
                )
            group[parts[1]] = (member, data)
            continue
        if key is not None:
            yield key, [(ext, m, d) for ext, (m, d) in group.items()]
        if parts[0] in seen:
            raise SourceError(
                f"{_at(source, member)}: key {parts[0]!r} comes back after other keys; the members of a sample "
                "must be consecutive in the tar (WebDataset would make two samples of it)"
            )
        key, group = parts[0], {parts[1]: (member, data)}
        seen.add(key)
    if key is not None:
        yield key, [(ext, m, d) for ext, (m, d) in group.items()]


def _at(source: str, member: Member) -> str:
    return f"{source}: byte {member.header}, member {member.name!r}"


def _tar_members(source: str) -> list[Member]:
    """The file members of a local tar, from its headers (the data is not read)."""
    try:
        with open(source, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise SourceError(f"{source}: not a readable tar file (it is empty)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return [member for member, _ in members(Blocks(source, data=data))]
    except OSError as exc:
        raise SourceError(f"{source}: cannot read it ({exc.strerror or exc})") from None


def _index(source: str) -> list[_Entry]:
    """Every sample of a local tar: (source, number, key, [(ext, offset, size), ...]) without reading the data."""
    found = ((m, None) for m in _tar_members(source))
    return [
        (source, number, key, [(ext, m.offset, m.size) for ext, m, _ in group])
        for number, (key, group) in enumerate(_samples(source, found))
    ]


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
                found = members(Blocks(source, stream=_decompressed(source, raw)), data=True)
                for number, (key, group) in enumerate(_samples(source, found)):
                    where = f"{source}: sample {number} ({key!r})"
                    yield {"__key__": key, **{ext: decode_member(where, ext, data) for ext, _, data in group}}


class _Joined(io.RawIOBase):
    """The bytes already read from a stream (to tell its compression), then the rest of it."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.head[: len(buffer)] if self.head else self.rest.read(len(buffer))
        self.head = self.head[len(data) :] if self.head else b""
        buffer[: len(data)] = data
        return len(data)


def _decompressed(source: str, raw: IO[bytes]) -> Readable:
    """The tar in ``raw``, decompressed as its first bytes say (gzip, bzip2, xz) or as it is."""
    head = raw.read(6)
    joined = io.BufferedReader(_Joined(head, raw))
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=joined, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(joined)
    if head.startswith(b"\xfd7zXZ"):
        return lzma.LZMAFile(joined)
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        raise SourceError(f"{source}: a zstd-compressed tar, which this reader cannot decompress; decompress it first")
    return joined


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
