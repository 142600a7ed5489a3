"""torchrecord: pre-shuffled TensorProtos records in LMDB, read fast by PyTorch.

Write once with :func:`write_record` (or push samples into a
:class:`RecordWriter`, or write shards in parallel with :func:`write_shard` and
:func:`finalize_shards`), read in a DataLoader with :class:`RecordDataset`, or
randomly through :func:`open_set` (a :class:`RecordFile` or a :class:`ShardedSet`,
both a :class:`RecordSet`); mix many sets by weight with
:class:`MixedDataset`; for data that fits in memory, :func:`load` it
and draw batches with :class:`BatchIter` or :class:`GroupBatchIter`.
"""

from typing import Any

from torchrecord._check.verify import VerifyReport, verify
from torchrecord._core.schema import Field, Schema
from torchrecord._lerobot.dataset import LeRobotDataset
from torchrecord._lerobot.stream import LeRobotStreamDataset
from torchrecord._memory.batches import BatchIter, GroupBatchIter, SampleList, load
from torchrecord._mix.dataset import MixedDataset
from torchrecord._read.collate import collate
from torchrecord._read.dataset import RecordDataset
from torchrecord._read.loader import RecordLoader
from torchrecord._read.state import loader_position
from torchrecord._robomimic.datasets import SequenceDataset, WindowDataset
from torchrecord._shards.open import open_set
from torchrecord._shards.sharded import ShardedSet
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import RecordSet
from torchrecord._store.summary import SkippedSample, WriteSummary
from torchrecord._streams.dataset import StreamDataset
from torchrecord._version import __version__
from torchrecord._write.settings import StoreOptions, WriteOptions, WriterOptions
from torchrecord._write.shards import finalize_shards, write_shard
from torchrecord._write.writer import RecordWriter, write_record
from torchrecord.errors import (
    ArgumentError,
    ArgumentTypeError,
    CacheError,
    ChecksumError,
    CorruptRecordError,
    FetchError,
    FormatError,
    IgnoredOptionWarning,
    IncompleteRecordSetError,
    IndexOutOfRangeError,
    InternalError,
    LoaderMismatchError,
    MissingDatasetKeyWarning,
    MissingDependencyError,
    NotARecordSetError,
    RecordExistsError,
    RecordNotFoundError,
    RecordReplacedError,
    ResumeStateError,
    SampleTypeError,
    SampleValueError,
    SchemaError,
    SourceError,
    StructureError,
    TooManyOpenFilesError,
    TorchRecordError,
    TorchRecordWarning,
    VariableShapeWarning,
    VersionError,
    WriteError,
    WriterClosedError,
)

#: The loader of a StreamDataset is the one loader of every reader (the name of earlier versions).
StreamLoader = RecordLoader

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BatchIter",
    "CacheError",
    "ChecksumError",
    "CorruptRecordError",
    "FetchError",
    "Field",
    "FormatError",
    "GroupBatchIter",
    "IgnoredOptionWarning",
    "IncompleteRecordSetError",
    "IndexOutOfRangeError",
    "InternalError",
    "LeRobotDataset",
    "LeRobotStreamDataset",
    "LoaderMismatchError",
    "MissingDatasetKeyWarning",
    "MissingDependencyError",
    "MixedDataset",
    "NotARecordSetError",
    "RecordDataset",
    "RecordExistsError",
    "RecordFile",
    "RecordLoader",
    "RecordNotFoundError",
    "RecordReplacedError",
    "RecordSet",
    "RecordWriter",
    "ResumeStateError",
    "SampleList",
    "SampleTypeError",
    "SampleValueError",
    "Schema",
    "SchemaError",
    "SequenceDataset",
    "ShardedSet",
    "SkippedSample",
    "SourceError",
    "StoreOptions",
    "StreamDataset",
    "StreamLoader",
    "StructureError",
    "TooManyOpenFilesError",
    "TorchRecordError",
    "TorchRecordWarning",
    "VariableShapeWarning",
    "VerifyReport",
    "VersionError",
    "WindowDataset",
    "WriteError",
    "WriteOptions",
    "WriteSummary",
    "WriterClosedError",
    "WriterOptions",
    "__version__",
    "collate",
    "finalize_shards",
    "load",
    "loader_position",
    "open_set",
    "verify",
    "write_record",
    "write_shard",
]


def _present_as_public() -> None:
    """Show every public name as ``torchrecord.NAME`` in help(), reprs and pickles.

    The names are defined in private modules (``torchrecord._read.dataset``...), which may move;
    ``torchrecord.NAME`` is the one path a user, a pickle or a saved config should hold.
    """
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith(f"{__name__}._"):
            obj.__module__ = __name__


_CHECKS = (
    "integrity checks on read are check='checksums' (each record's CRC-32, as it is read) or "
    "check='structure' (LMDB's page structure, checked before the file is mapped: files of unknown provenance); "
    "torchrecord.verify(path) checks a whole set once"
)


def _refuse_misnamed_arguments() -> None:
    """``verify=True`` given to a reader class raises ArgumentTypeError naming ``check=``, not a bare TypeError.

    The check is a ``__new__`` of each class taking ``check=``: its ``__init__`` runs as before, so
    the warnings it gives still point at the caller's line, and public functions stay the very
    objects their modules define.
    """
    import functools
    import inspect

    for name in __all__:
        cls = globals()[name]
        if not isinstance(cls, type) or issubclass(cls, BaseException) or "__new__" in vars(cls):
            continue
        try:
            params = inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):
            continue
        if "check" in params and "verify" not in params:
            refuse = _refusing(cls.__new__, f"{name}() has no argument verify=: {_CHECKS}")
            # wraps: inspect.signature(cls) still shows __init__'s arguments
            cls.__new__ = staticmethod(functools.wraps(cls.__init__)(refuse))  # type: ignore[method-assign]


def _refusing(new: Any, message: str) -> Any:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if "verify" in kwargs:
            raise ArgumentTypeError(message)
        return new(cls) if new is object.__new__ else new(cls, *args, **kwargs)

    return __new__


_present_as_public()
_refuse_misnamed_arguments()
