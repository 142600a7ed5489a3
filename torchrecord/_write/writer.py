"""Writing record sets: ``write_record`` reads a whole source, ``RecordWriter`` takes pushed samples.

Nothing appears at the target path until the write is complete: records go to a
hidden temporary file beside it, which is renamed over the path at the end. Both
entry points run the same :class:`~torchrecord._write.session.WriteSession`; the parts
it puts together live in ``_sources`` (reading a source), ``_admission`` (schema
and error policy), ``_grouping`` (group keys), ``_packing`` (records),
``_spool`` (the shuffle spool) and ``_publish`` (temporary files and the rename).
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, NoReturn

import numpy as np
from typing_extensions import Unpack

from torchrecord._core.progress import progress_bar
from torchrecord._store.paths import expand
from torchrecord._store.record_file import RecordFile
from torchrecord._write.publish import as_write_error
from torchrecord._write.session import WriteSession
from torchrecord._write.settings import SchemaArg, WriteOptions, WriterOptions, WriteSettings, spell_out
from torchrecord._write.sources import Preparer, is_map_style, iterate_source, read_in_order
from torchrecord.errors import ArgumentTypeError, IgnoredOptionWarning, TorchRecordWarning, WriterClosedError

__all__ = ["RecordWriter", "SchemaArg", "put_entries", "write_record", "write_source"]

#: cli.py and verify.py take their progress bar from here
_progress_bar = progress_bar

#: A path as ``RecordFile`` takes it: str, bytes or a path-like object.
PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]


@spell_out(WriteOptions)
def write_record(dataset: Any, path: PathArg, **options: Unpack[WriteOptions]) -> RecordFile:
    """Write every sample of ``dataset`` to a record set at ``path``.

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``) or any
            iterable. Samples are tensors, NumPy arrays, Python scalars, bytes or
            str, or tuples/lists/dicts (str keys) of these, nested. A list whose
            items are all Python numbers of one kind (all bool, all int, or ints
            and floats) is one field: a 1-d tensor (bool, int64 or float64) whose
            length may vary from sample to sample (token ids).
        path: the record set to create: a single file (str, bytes or path-like).
        **options: the write options, keyword-only, each with its default
            (``shuffle=True``, ``seed=0``, ``on_error="raise"``, ...; the list is
            :class:`WriteOptions`). An unknown keyword is a TypeError.

    Returns:
        A :class:`RecordFile` for the new record set; its ``write_summary`` says
        what was skipped and which fields turned variable. It reads this write's
        set: if another write replaced ``path`` before it opens, it raises
        ``RecordReplacedError`` instead of reading that other set.

    Raises:
        RecordExistsError: ``path`` exists and ``overwrite`` is false (also when
            another writer published there while this one was writing).
        SourceError: the source raised at a sample (``on_error="raise"``; its
            exception is the ``__cause__``), every sample failed or more than
            ``max_skipped`` did, or a group came back after another one.
        SampleTypeError, SampleValueError: a sample holds a value the format
            cannot store (None, a set, an int beyond int64, no ``group_by``
            field), named by the file, the sample and the field.
        SchemaError: a sample's structure or dtype differs from the first one's,
            or breaks the stated ``schema``.
        ValueError, TypeError: an option cannot work, or is no option (checked
            before reading).
        WriteError: the write failed (disk full, ...); nothing is left at ``path``.
    """
    _check_arguments(dataset, path)
    settings = WriteSettings.of(options, "write_record")
    return write_source(dataset, expand(path), settings)  # ~ as the shell reads it


def _check_arguments(dataset: Any, path: Any) -> None:
    """Swapped arguments and a path that is none are named; a source of no samples (``len`` 0) is warned about."""
    paths = (str, bytes, os.PathLike)
    if isinstance(dataset, paths):
        if not isinstance(path, paths):
            raise ArgumentTypeError(
                f"write_record(dataset, path): the arguments look swapped: dataset is the path {dataset!r} and "
                f"path a {type(path).__name__}; call write_record(samples, {dataset!r})"
            )
        raise ArgumentTypeError(
            f"write_record: the source is a {type(dataset).__name__} ({dataset!r}), not a dataset: give a sequence "
            "or an iterable of samples (to convert a file or folder: torchrecord.convert, `torchrecord convert`)"
        )
    if not isinstance(path, paths):
        raise ArgumentTypeError(f"write_record: path is a {type(path).__name__}, not a str or os.PathLike")
    if is_map_style(dataset) and len(dataset) == 0:
        warnings.warn(
            f"{os.fsdecode(path)}: the source has no samples (len 0): writing an empty record set",
            TorchRecordWarning,
            stacklevel=3,
        )


def write_source(
    dataset: Any,
    target: str,
    settings: WriteSettings,
    *,
    positions: slice | None = None,
    extra: dict[str, Any] | None = None,
    before_publish: Callable[[str], None] | None = None,
) -> RecordFile:
    """The body of :func:`write_record` (also used by ``write_shard``).

    ``positions``: write only these positions of the map-style write order (a
    shard's slice of the global permutation); ``extra``: more metadata keys;
    ``before_publish``: see :meth:`WriteSession.close`.
    """
    shuffle, seed, num_workers = settings.shuffle, settings.seed, settings.num_workers
    _hint_converter(dataset)
    map_style = is_map_style(dataset)
    if num_workers > 0 and not map_style:
        warnings.warn(
            f"{target}: num_workers={num_workers} is ignored: the source is an iterable "
            f"({type(dataset).__name__}), read in this process in its own order. To read it in parallel, "
            "pass a torch DataLoader over it as the source (DataLoader(source, batch_size=None, "
            "num_workers=N), each worker yielding its own share), or give a map-style dataset",
            IgnoredOptionWarning,
            stacklevel=3,
        )
    grouped = settings.group_by is not None
    # a map-style set is read in permuted order; groups and iterables are known only at the end
    session = WriteSession(
        target, settings.overwrite, settings, spool=shuffle and (grouped or not map_style), extra=extra
    )
    try:
        if map_style:
            n = len(dataset)
            order = np.random.default_rng(seed).permutation(n) if shuffle and not grouped else np.arange(n)
            if positions is not None:
                order = order[positions]
            session.admission.shuffled_read = shuffle and not grouped
            stream = read_in_order(
                dataset, order, num_workers, settings.multiprocessing_context, fast=session.fast, key=session.key
            )
            session.consume(stream, len(order))
        else:
            session.consume(iterate_source(dataset, fast=session.fast, key=session.key), None)
        return session.close(before_publish)
    except BaseException as exc:
        session.abort()
        _reraise(exc, target)


_HINTED: set[str] = set()


def _hint_converter(dataset: Any) -> None:
    """Once per process and kind: a Hugging Face dataset written row by row points to ``from_hf``."""
    kind = type(dataset).__name__
    if not type(dataset).__module__.startswith("datasets.") or kind in _HINTED:
        return
    _HINTED.add(kind)
    warnings.warn(
        f"write_record reads this {kind} one Python row at a time (and its Image columns as decoded "
        "PIL images, which it cannot store); torchrecord.convert.from_hf reads its Arrow batches, keeps "
        "images encoded and stores the ClassLabel names (shown once per process)",
        TorchRecordWarning,
        stacklevel=4,
    )


class RecordWriter:
    """Write a record set by pushing samples, published atomically when the block ends.

    ``append`` takes one sample at a time. Leaving the ``with`` block normally
    (or calling :meth:`close`) publishes the set at ``path`` with one atomic
    rename; leaving it by an exception, calling :meth:`abort`, or an error in
    ``append`` removes everything written and leaves ``path`` as it was (the
    previous set there, or nothing). A writer killed mid-way (SIGKILL) leaves
    only hidden files (a temporary and its lock file), removed by the next write
    to ``path`` once its lock is free.

    With ``shuffle=True`` the samples are spooled to a temporary file beside
    ``path`` and written at close in an order seeded by ``seed`` (the same
    permutation ``write_record`` gives an iterable); with ``shuffle=False`` they
    are appended as they come. Memory stays bounded either way.

    A writer holds an open LMDB file: use it from one thread of the process that
    created it (never across ``fork``).

    Args:
        path: the record set to create: a single file.
        **options: the write options of :func:`write_record` but those of
            reading a source (:class:`WriterOptions`); ``overwrite`` replaces an
            existing set at close, and ``group_by`` samples of one group must be
            appended one after another.

    Attributes:
        result: the published :class:`RecordFile` after a successful close, else
            None; ``result.write_summary`` says what was skipped and which fields
            turned variable.

    Raises:
        RecordExistsError: at creation, when ``path`` exists and ``overwrite`` is false.

    Example:
        >>> with RecordWriter("train.tr", seed=0) as w:        # doctest: +SKIP
        ...     for image, label in pairs:
        ...         w.append({"image": image, "label": label})
        >>> w.result                                           # doctest: +SKIP
        RecordFile('train.tr')
    """

    @spell_out(WriterOptions)
    def __init__(self, path: PathArg, **options: Unpack[WriterOptions]) -> None:
        self.path = os.fsdecode(path)
        settings = WriteSettings.of(options, "RecordWriter", WriterOptions)
        self.result: RecordFile | None = None
        self._session: WriteSession | None = None
        try:
            session = WriteSession(self.path, settings.overwrite, settings, spool=settings.shuffle, source="append")
        except BaseException as exc:
            _reraise(exc, self.path)
        self._session = session
        self._prepare = Preparer(session.fast, session.key)
        self._appended = 0
        # a writer dropped without close or abort (or alive at exit) removes its files
        self._cleanup = weakref.finalize(self, _abort_in, session, os.getpid())

    def append(self, sample: Any) -> None:
        """Add one sample (same kinds as :func:`write_record`); an error aborts the write."""
        session = self._open_session()
        try:
            session.push(self._prepare(self._appended, sample))
        except BaseException as exc:
            self._fail(exc)
        self._appended += 1

    def close(self) -> RecordFile:
        """Publish the set (once; later calls return the same result) and return it."""
        if self.result is not None:
            return self.result
        session = self._open_session()
        try:
            self.result = session.close()
        except BaseException as exc:
            self._fail(exc)
        self._session = None
        self._cleanup.detach()
        return self.result

    def abort(self) -> None:
        """Discard the write: nothing is published (no effect after a successful close)."""
        if self._session is not None:
            self._session = None
            self._cleanup()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._session is not None:  # not aborted inside the block
            self.close()

    def __repr__(self) -> str:
        state = "published" if self.result is not None else "open" if self._session is not None else "aborted"
        return f"RecordWriter({self.path!r}, {state})"

    def _open_session(self) -> WriteSession:
        if self._session is None:
            what = "was published" if self.result is not None else "was aborted"
            raise WriterClosedError(f"{self.path}: this RecordWriter {what}; create a new one to write again")
        return self._session

    def _fail(self, exc: BaseException) -> NoReturn:
        self.abort()
        _reraise(exc, self.path)


def put_entries(writer: RecordWriter, entries: Iterable[tuple[bytes, bytes]]) -> None:
    """Store (key, value) entries in the ``meta`` database of ``writer``'s set, beside its records.

    Internal (the robomimic converter keeps each demo's final frames there, out
    of every reader's sample index); an error aborts the write, as in
    :meth:`RecordWriter.append`.
    """
    session = writer._open_session()
    try:
        session.put_entries(entries)
    except BaseException as exc:
        writer._fail(exc)


def _abort_in(session: WriteSession, pid: int) -> None:
    """Abort ``session`` in the process that started it (a forked child must not delete its files)."""
    if os.getpid() == pid:
        session.abort()


def _reraise(exc: BaseException, target: str) -> NoReturn:
    """Raise ``exc``, LMDB and OS errors as a WriteError naming the target."""
    error = as_write_error(exc, target)
    if error is exc:
        raise exc
    raise error from exc
