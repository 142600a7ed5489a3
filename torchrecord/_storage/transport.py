"""The storage seam: what torchrecord asks of a place where remote sets live, and the fsspec back end.

:class:`Transport` is what reading needs (open a file as a stream). :class:`Storage` adds what
writing and checking need: list a folder, look at one object (size and the metadata stored with
it), put a file whole, remove one, and clean up the uploads a killed writer left. A back end
implements :class:`Storage` (or only :class:`Transport`, for a read-only set) and is registered
for its URL schemes in ``_storage/__init__.py``; a user may also pass one (or an fsspec file
system) straight to :class:`~torchrecord.ShardedSet`, ``open_set``, ``write_shard`` and
``finalize_shards`` (``storage=``).

:class:`FsspecStorage` reaches every protocol fsspec knows (``http(s)://`` through aiohttp,
``s3://``, ``gs://``, ``file://``); on ``s3://`` it stores torchrecord's metadata with each object
and aborts a killed writer's multipart uploads. It never trusts fsspec's cached listings: every
look at the folder asks the server, so a set finalized by another process opens at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from torchrecord._core.extras import REMOTE_HINT, S3_HINT
from torchrecord._storage.location import env_number
from torchrecord._storage.transfer import TIMEOUT, Stream
from torchrecord.errors import MissingDependencyError

__all__ = ["FsspecStorage", "ObjectInfo", "PART_SIZE", "PART_SIZE_ENV", "Storage", "Transport", "is_http"]

#: Bytes of each part of a multipart upload (s3fs uploads files of twice this or more in parts);
#: ``$TORCHRECORD_UPLOAD_PART_SIZE`` sets another (S3 takes 5 MiB at least).
PART_SIZE = 64 << 20
PART_SIZE_ENV = "TORCHRECORD_UPLOAD_PART_SIZE"


@runtime_checkable
class Transport(Protocol):
    """How a remote file is read. ``open`` should honour ``deadline`` (seconds for the whole transfer)
    where the back end can (torchrecord also enforces it); ``size`` is the file's size where the
    manifest gives it (torchrecord never reads more), else None. FileNotFoundError: not there."""

    def open(self, url: str, deadline: float | None, size: int | None) -> Stream: ...


@dataclass
class ObjectInfo:
    """One object: its size and the metadata stored with it (lower-case keys; empty where the back end keeps none)."""

    size: int
    metadata: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Storage(Transport, Protocol):
    """A place remote sets are read from and written to; URLs are ``scheme://...`` throughout."""

    def names(self, url: str) -> list[str]:
        """The names of the objects directly under the folder ``url`` (none if it does not exist)."""
        ...

    def stat(self, url: str) -> ObjectInfo | None:
        """The object at ``url`` as the server has it now (None: not there)."""
        ...

    def put_file(self, local: str, url: str, metadata: dict[str, str]) -> None:
        """Upload the finished file ``local`` to ``url`` whole (it appears whole or not at all), with ``metadata``."""
        ...

    def put_bytes(self, url: str, data: bytes) -> None:
        """Upload ``data`` to ``url`` whole."""
        ...

    def remove(self, url: str) -> None:
        """Remove the object at ``url`` (nothing if it is not there)."""
        ...

    def abort_uploads(self, url: str, started_before: float) -> int:
        """Abort unfinished uploads to ``url`` begun before ``started_before`` (a time.time()); returns how many."""
        ...


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


class FsspecStorage:
    """Every protocol fsspec knows, through an fsspec file system.

    HTTP responses are streamed in one request, with ``TIMEOUT`` to connect and between two
    reads. On ``s3://`` an upload carries torchrecord's metadata (``x-amz-meta-torchrecord-*``)
    and files of ``2 * part_size`` bytes or more go up in parts.

    Args:
        storage_options: keyword arguments for the fsspec file system (for ``s3://``: s3fs's
            ``key``, ``secret``, ``endpoint_url``, ``client_kwargs``...). None: the back end's
            defaults, which for S3 are the usual environment variables (``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...).
        filesystem: an fsspec file system to use as it is (then ``storage_options`` is not taken).
        part_size: bytes of each part of a multipart upload (None: ``$TORCHRECORD_UPLOAD_PART_SIZE``, else 64 MiB).

    File systems built here are fsspec's cached instances (one per protocol and options; fsspec
    starts afresh in a forked child), except for http(s), built per transfer.
    """

    def __init__(
        self, storage_options: dict[str, Any] | None = None, filesystem: Any = None, part_size: int | None = None
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.fs = filesystem
        chosen = env_number(PART_SIZE_ENV, PART_SIZE, integer=True)
        self.part_size = int(part_size if part_size is not None else chosen or PART_SIZE)

    def filesystem(self, url: str, deadline: float | None = None) -> tuple[Any, str]:
        """(fsspec file system, path) for ``url``."""
        if self.fs is not None:
            return self.fs, str(self.fs._strip_protocol(url))
        try:
            import fsspec
        except ImportError as exc:
            hint = S3_HINT if url.startswith(("s3://", "s3a://")) else REMOTE_HINT
            raise MissingDependencyError(f"{url}: a remote set needs fsspec: {hint}") from exc
        options: dict[str, Any] = dict(self.storage_options)
        if is_http(url):
            try:
                import aiohttp
            except ImportError as exc:
                raise MissingDependencyError(f"{url}: http(s) needs aiohttp: {REMOTE_HINT}") from exc
            timeout = aiohttp.ClientTimeout(total=deadline, sock_connect=TIMEOUT, sock_read=TIMEOUT)
            options["client_kwargs"] = {**options.get("client_kwargs", {}), "timeout": timeout}
            options["skip_instance_cache"] = True  # its event loop thread must not cross a fork
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:  # fsspec knows the protocol, its back end is not installed
            raise MissingDependencyError(f"{url}: {_backend_hint(url, exc)}") from exc
        return fs, str(path)

    def open(self, url: str, deadline: float | None, size: int | None) -> Stream:
        fs, path = self.filesystem(url, deadline)
        if is_http(url):
            # one streamed GET, no ranges; a size skips fsspec's HEAD request (a stream does not use it)
            stream: Stream = fs.open(path, "rb", block_size=0, size=size or 1)
        else:
            _forget(fs, path)  # a listing cached before the file appeared must not hide it
            stream = fs.open(path, "rb")
        return stream

    def names(self, url: str) -> list[str]:
        fs, path = self.filesystem(url)
        path = path.rstrip("/")
        _forget(fs, path)
        try:
            found = fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        finally:
            _forget(fs, path)  # nor this listing, once the folder changes
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

    def stat(self, url: str) -> ObjectInfo | None:
        fs, path = self.filesystem(url)
        _forget(fs, path)
        try:
            size = int(fs.info(path)["size"])
            metadata = fs.metadata(path) if _is_s3(fs) else {}
        except FileNotFoundError:
            return None
        return ObjectInfo(size, {str(k).lower(): str(v) for k, v in (metadata or {}).items()})

    def put_file(self, local: str, url: str, metadata: dict[str, str]) -> None:
        fs, path = self.filesystem(url)
        if _is_s3(fs):
            fs.put_file(local, path, Metadata=dict(metadata), chunksize=self.part_size)
        else:
            fs.put_file(local, path)
        _forget(fs, path)

    def put_bytes(self, url: str, data: bytes) -> None:
        fs, path = self.filesystem(url)
        fs.pipe_file(path, data)
        _forget(fs, path)

    def remove(self, url: str) -> None:
        fs, path = self.filesystem(url)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
        _forget(fs, path)

    def abort_uploads(self, url: str, started_before: float) -> int:
        fs, path = self.filesystem(url)
        if not _is_s3(fs):
            return 0  # other back ends leave nothing half-uploaded that torchrecord can see
        bucket, key, _ = fs.split_path(path)
        answer = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
        aborted = 0
        for upload in answer.get("Uploads", []) or []:
            initiated = upload.get("Initiated")
            when = initiated.timestamp() if hasattr(initiated, "timestamp") else 0.0
            if upload.get("Key") == key and when < started_before:
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload["UploadId"])
                aborted += 1
        return aborted


def _is_s3(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", ())
    return bool({"s3", "s3a"} & set([protocol] if isinstance(protocol, str) else protocol))


def _forget(fs: Any, path: str) -> None:
    """Drop fsspec's cached listing of ``path`` and its folder (fsspec refills it on the next listing)."""
    try:
        fs.invalidate_cache(path)
        fs.invalidate_cache(path.rstrip("/").rsplit("/", 1)[0])
    except Exception:
        pass


def _backend_hint(url: str, exc: ImportError) -> str:
    """The one-line install hint for the fsspec back end of ``url``'s protocol."""
    if url.startswith(("s3://", "s3a://")):
        return f"s3:// needs s3fs: {S3_HINT}"
    return f"fsspec has no back end installed for this protocol ({exc})"
