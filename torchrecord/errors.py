"""The exceptions torchrecord raises.

Every error the library raises on purpose derives from :class:`TorchRecordError`
and, where one fits, from the matching builtin too, so ``except FileNotFoundError``
or ``except ValueError`` keeps working::

    TorchRecordError
    ├── RecordNotFoundError      (also FileNotFoundError)  no record set at the path
    │   └── RecordReplacedError                            the path holds another set than this RecordFile's
    ├── RecordExistsError        (also FileExistsError)    target exists, overwrite=False
    ├── FormatError              (also ValueError)         the file is not what it should be
    │   ├── NotARecordSetError                             not LMDB, or no torchrecord metadata
    │   ├── IncompleteRecordSetError                       written but never finished
    │   ├── VersionError                                   written by a newer format version
    │   └── CorruptRecordError                             a record fails to decode
    │       ├── ChecksumError                              a record's CRC does not match
    │       └── StructureError                             LMDB's own page structure is damaged
    ├── SchemaError              (also ValueError)         a sample differs from the first one
    ├── SourceError                                        the source failed at sample i, or is unusable
    ├── WriteError               (also OSError)            the write failed (disk full, ...)
    ├── TooManyOpenFilesError    (also OSError)            the process ran out of file descriptors
    └── FetchError               (also OSError)            a remote shard or manifest could not be fetched

    TorchRecordWarning           (a UserWarning)
    ├── VariableShapeWarning                               a field's shape changed during a write
    └── IgnoredOptionWarning                               an option has no effect on this source

Messages name the file, the record (or sample) index and the field where they
are known, and say what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ChecksumError",
    "CorruptRecordError",
    "FetchError",
    "FormatError",
    "IgnoredOptionWarning",
    "IncompleteRecordSetError",
    "NotARecordSetError",
    "RecordExistsError",
    "RecordNotFoundError",
    "RecordReplacedError",
    "SchemaError",
    "SourceError",
    "StructureError",
    "TooManyOpenFilesError",
    "TorchRecordError",
    "TorchRecordWarning",
    "VariableShapeWarning",
    "VersionError",
    "WriteError",
]


class TorchRecordError(Exception):
    """Base class of every error torchrecord raises on purpose."""


class RecordNotFoundError(TorchRecordError, FileNotFoundError):
    """No record set exists at the given path."""


class RecordReplacedError(RecordNotFoundError):
    """The path now holds another record set than the one this RecordFile reads.

    A RecordFile reads one record set: the one its writer published (the
    RecordFile ``write_record`` returns), or the one it first opened. When
    another write replaced the file at the path since, re-opening it (after
    ``close()``, or in a process it was pickled to) raises this instead of
    reading the other set.
    """


class RecordExistsError(TorchRecordError, FileExistsError):
    """The target path exists and ``overwrite=True`` was not given."""


class FormatError(TorchRecordError, ValueError):
    """The file at the path is not a valid record set, or a record is malformed."""


class NotARecordSetError(FormatError):
    """The file is not an LMDB environment, or has no torchrecord metadata."""


class IncompleteRecordSetError(FormatError):
    """The record set was never finished (no completeness marker)."""


class VersionError(FormatError):
    """The record set was written by a newer, unsupported format version."""


class CorruptRecordError(FormatError):
    """A record does not decode to what its schema says."""


class ChecksumError(CorruptRecordError):
    """A record's stored checksum does not match its bytes."""


class SchemaError(TorchRecordError, ValueError):
    """A sample's structure, dtype or rank differs from the first sample's."""


class SourceError(TorchRecordError):
    """The source failed: it raised at sample i (the cause is chained), or as a whole
    it cannot be read (missing path, empty folder, arrays of different lengths)."""


class WriteError(TorchRecordError, OSError):
    """Writing the record set failed (for example the disk is full)."""


class TooManyOpenFilesError(TorchRecordError, OSError):
    """The process has no file descriptor left (EMFILE) or the system none (ENFILE) to open a set.

    Raised instead of blaming the file: close RecordFiles no longer needed
    (``close()`` or a ``with`` block), or raise the limit (``ulimit -n``).
    """


class FetchError(TorchRecordError, OSError):
    """A remote sharded set's manifest or shard could not be fetched (server down, timeout, missing)."""


class StructureError(CorruptRecordError):
    """LMDB's own page structure is damaged: found by the structural check, or a
    process reading the file with liblmdb died on it (signal, timeout)."""

    HINT = "the file is damaged: copy it again from its source or rewrite it with write_record"


class TorchRecordWarning(UserWarning):
    """Base class of every warning torchrecord gives."""


class VariableShapeWarning(TorchRecordWarning):
    """A field's shape changed during a write that did not state it (``schema=``).

    The set is written with that dimension variable (``None``): batch mode then
    gives lists for the field instead of one stacked tensor, and the fast path
    is off. State the shape with ``schema=`` to accept it silently, or fix the
    source.
    """


class IgnoredOptionWarning(TorchRecordWarning):
    """An option was given that has no effect on this source (e.g. ``num_workers`` with an iterator)."""
