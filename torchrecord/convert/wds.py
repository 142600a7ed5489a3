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
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, Literal

from torchrecord._core.extras import REMOTE_HINT
from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import WriteSettings
from torchrecord._write.writer import SchemaArg
from torchrecord.convert._common import write
from torchrecord.errors import ArgumentError, MissingDependencyError, SourceError

__all__ = ["TarSamples", "decode_member", "from_webdataset", "split_key"]

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


def _index(source: str) -> list[_Entry]:
    """Every sample of a local tar: (source, key, [(ext, offset, size), ...]) without reading the data."""
    entries: list[_Entry] = []
    try:
        tar = tarfile.open(source, "r:")  # noqa: SIM115  # closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"{source}: not a readable tar file ({exc})") from None
    with tar:
        for key, ext, member in _members(source, tar):
            if entries and entries[-1][2] == key:
                entries[-1][3].append((ext, member.offset_data, member.size))
            else:
                entries.append((source, len(entries), key, [(ext, member.offset_data, member.size)]))
    return entries


class TarSamples:
    """Map-style dataset over indexed local tars: sample ``i`` read from its members' offsets.

    Picklable (each sample opens its tar), so ``num_workers`` read in parallel.
    """

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> dict[str, Any]:
        source, number, key, members = self.entries[index]
        sample: dict[str, Any] = {"__key__": key}
        with open(source, "rb") as f:
            for ext, offset, size in members:
                f.seek(offset)
                data = f.read(size)
                if len(data) != size:
                    raise SourceError(f"{source}: sample {number} ({key!r}), .{ext}: the tar ends early")
                sample[ext] = decode_member(f"{source}: sample {number} ({key!r})", ext, data)
        return sample


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


def from_webdataset(
    paths_or_urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    shard: int | None = None,
    num_shards: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    max_skipped: int | float | None = None,
    checksums: bool = True,
    samples_per_record: int | None = None,
    group_by: str | Callable[[Any], Any] | None = None,
    schema: SchemaArg = None,
    initial_map_size: int = 1 << 28,
    commit_bytes: int = 64 << 20,
    multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
    compression: Literal["zstd", "lz4"] | Mapping[str, Literal["zstd", "lz4"] | None] | None = None,
    compression_level: int | None = None,
) -> RecordFile:
    """Convert WebDataset tar shards into a record set, one sample per ``__key__`` (see this module).

    Args:
        paths_or_urls: a tar file, a folder of them, a URL, or a list of these
            (read in this order).
        path: the record set to write (a folder with ``num_shards``).
        shard, num_shards: write shard ``shard`` of ``num_shards`` of a sharded
            set in the folder ``path`` (see :func:`torchrecord.write_shard`);
            streamed tars are dealt out to the shards (shard i reads tars i,
            i + n, ...), so there must be at least ``num_shards`` of them.
        shuffle, seed, num_workers, overwrite, progress, metadata, on_error,
        max_skipped, checksums, samples_per_record, group_by, schema,
        initial_map_size, commit_bytes, multiprocessing_context, compression,
        compression_level: as for :func:`torchrecord.write_record`, with the
            same defaults; ``metadata`` is stored beside the converter's keys
            (``source_format``, ``tars``: the number of tars read).

    Raises:
        SourceError: a tar is missing or damaged, a ``.cls`` or ``.json`` member
            does not decode (naming the tar, sample and key).
        MissingDependencyError: a URL without fsspec (``remote`` extra).
    """
    settings = WriteSettings.of(locals())
    sources = _sources(paths_or_urls)
    meta = {"source_format": "webdataset", "tars": len(sources)}
    if all(_local(s) for s in sources):
        entries: list[_Entry] = []
        for source in sources:
            entries += _index(source)
        if not entries:
            raise SourceError(f"{sources[0]}{' ...' if len(sources) > 1 else ''}: holds no samples")
        return write(TarSamples(entries), path, meta, settings, shard, num_shards)
    if shard is not None and num_shards is not None:
        if len(sources) < num_shards:
            raise ArgumentError(
                f"{len(sources)} streamed tars cannot make {num_shards} shards (each shard reads whole tars); "
                "use fewer shards, or local uncompressed tars"
            )
        if 0 <= shard < num_shards:
            sources = sources[shard::num_shards]
    return write(_TarStream(sources), path, meta, settings, shard, num_shards)
