"""The exceptions torchrecord raises.

Every error the library raises on purpose derives from :class:`TorchRecordError`
and, where one fits, from the matching builtin too, so ``except FileNotFoundError``
or ``except ValueError`` keeps working::

    TorchRecordError
    ├── ArgumentError            (also ValueError)         an argument's value is invalid, or contradicts another
    │   ├── ResumeStateError                               a resume state or position that does not fit the dataset
    │   └── LoaderMismatchError                            a DataLoader that breaks the dataset's order or length
    ├── ArgumentTypeError        (also TypeError)          an argument of the wrong type
    ├── IndexOutOfRangeError     (also IndexError)         a sample, record, group, shard or window index out of range
    ├── MissingDependencyError   (also ImportError)        an optional package is not installed
    ├── SampleValueError         (also ValueError)         a sample holds a value the format cannot store
    ├── SampleTypeError          (also TypeError)          a sample holds a leaf of a type the format cannot store
    ├── WriterClosedError        (also ValueError)         a RecordWriter used after it was published or aborted
    ├── InternalError            (also RuntimeError)       an internal consistency check failed (please report it)
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
    ├── FetchError               (also OSError)            a remote shard or manifest could not be fetched
    └── CacheError               (also OSError)            the shard cache's folder is not safe to use (another
                                                            user's, writable by others, a symlink)

    TorchRecordWarning           (a UserWarning)
    ├── VariableShapeWarning                               a field's shape changed during a write, or differs in a mix
    ├── IgnoredOptionWarning                               an option has no effect on this source
    └── MissingDatasetKeyWarning                           a robomimic dataset key the source lacks reads as zeros

Messages name the file, the record (or sample) index and the field where they
are known, and say what to do about it.

Plain builtins remain only where Python's protocols want them (the
``NotImplementedError`` of an abstract method), where an OS call is emulated
(and its caller converts the error), and in internal signals that never leave
the package; tests/test_error_classes.py lists each of them.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CacheError",
    "ChecksumError",
    "CorruptRecordError",
    "FetchError",
    "FormatError",
    "IgnoredOptionWarning",
    "IncompleteRecordSetError",
    "IndexOutOfRangeError",
    "InternalError",
    "LoaderMismatchError",
    "MissingDatasetKeyWarning",
    "MissingDependencyError",
    "NotARecordSetError",
    "RecordExistsError",
    "RecordNotFoundError",
    "RecordReplacedError",
    "ResumeStateError",
    "SampleTypeError",
    "SampleValueError",
    "SchemaError",
    "SourceError",
    "StructureError",
    "TooManyOpenFilesError",
    "TorchRecordError",
    "TorchRecordWarning",
    "VariableShapeWarning",
    "VersionError",
    "WriteError",
    "WriterClosedError",
]


class TorchRecordError(Exception):
    """Base class of every error torchrecord raises on purpose."""


class ArgumentError(TorchRecordError, ValueError):
    """An argument's value is invalid, contradicts another argument, or does not fit the record set it is
    used with (a field, key or filter the set lacks; a set with no samples or no groups).

    The message names the argument and says what to give instead.
    """


class ResumeStateError(ArgumentError):
    """A resume state or position does not fit the dataset it is loaded into.

    Raised by ``load_state_dict`` and ``loader_position`` for a state of another
    record set or subset, of a later epoch, of a newer state version, saved with
    other settings (sources, weights, seed, batch size, world size, ...), of
    another reader than the one loading it, or for something that is not a
    torchrecord state at all. The message says how to resume instead (or to
    start the epoch afresh).
    """


class LoaderMismatchError(ArgumentError):
    """A DataLoader's configuration breaks the dataset's order or ``len(loader)``.

    Raised by ``check_loader`` when the loader reads another dataset, would
    yield another number of batches than ``len(loader)`` says (the message names
    the ``loader_batch_size`` that fixes it), batches a dataset that yields whole
    batches, or delivers out of order.
    """


class ArgumentTypeError(TorchRecordError, TypeError):
    """An argument has the wrong type (a float or bool where an int is needed, a str where a dict is, ...)."""


class IndexOutOfRangeError(TorchRecordError, IndexError):
    """A sample, record, group, shard or window index is outside the set; the message gives the count."""


class MissingDependencyError(TorchRecordError, ImportError):
    """An optional package this feature needs is not installed; the message says what to ``pip install``."""


class SampleValueError(TorchRecordError, ValueError):
    """A sample holds a value the format cannot store, named by its field.

    For example an int beyond int64, an array of rank above 32, bool data that
    holds bytes other than 0 and 1, or no value for the ``group_by`` field. A
    write raises it itself, naming the file, the sample and the field
    (``on_error="skip"`` leaves such samples out), never as a SourceError.
    """


class SampleTypeError(TorchRecordError, TypeError):
    """A sample holds a leaf of a type the format cannot store, named by its field.

    For example None, a set, an unsupported dtype, a dict with keys that are not
    str, nesting deeper than 32 levels, or a group key that is not one hashable
    value. A write raises it itself, naming the file, the sample and the field
    (``on_error="skip"`` leaves such samples out), never as a SourceError.
    """


class WriterClosedError(TorchRecordError, ValueError):
    """A RecordWriter was used after it was published or aborted; create a new one to write again."""


class InternalError(TorchRecordError, RuntimeError):
    """An internal consistency check failed: a bug in torchrecord (please report it with the message),
    or an object closed by another thread while it was in use."""


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
    """The source failed: it raised at sample i (its exception is the ``__cause__``, with its
    traceback; not in the message), or as a whole it cannot be read (missing path, empty folder,
    arrays of different lengths), or too many samples failed under ``on_error="skip"``."""


class WriteError(TorchRecordError, OSError):
    """Writing the record set failed (for example the disk is full)."""


class TooManyOpenFilesError(TorchRecordError, OSError):
    """The process has no file descriptor left (EMFILE) or the system none (ENFILE) to open a set, or to hand
    a batch over from a DataLoader worker in a shared-memory slot.

    Raised instead of blaming the file: close RecordFiles no longer needed
    (``close()`` or a ``with`` block), or raise the limit (``ulimit -n``); for
    the handover, ``TORCHRECORD_HANDOVER=value`` uses no descriptor.
    """


class FetchError(TorchRecordError, OSError):
    """A remote sharded set's manifest or shard could not be fetched (server down, timeout, missing,
    past its transfer deadline, or larger than the manifest says)."""


class CacheError(TorchRecordError, OSError):
    """The remote shard cache's folder is not safe to use: owned by another user, writable by
    others, a symlink or not a directory. The cache keeps shards only in a folder of the user's own."""


class StructureError(CorruptRecordError):
    """LMDB's own page structure is damaged: found by the structural check, or a
    process reading the file with liblmdb died on it (signal, timeout)."""

    HINT = "the file is damaged: copy it again from its source or rewrite it with write_record"


class TorchRecordWarning(UserWarning):
    """Base class of every warning torchrecord gives."""


class VariableShapeWarning(TorchRecordWarning):
    """A field's shape changed during a write that did not state it (``schema=``),
    or differs between the sources of a ``MixedDataset``.

    The set is written (or the mix read) with that dimension variable (``None``):
    batch mode then gives lists for the field instead of one stacked tensor, and
    the fast path is off. State the shape with ``schema=`` to accept it silently,
    or fix the source. A mix's warning names the field and each source's shape;
    a DataLoader batching single samples of such a mix fails in ``torch.stack``.
    """


class IgnoredOptionWarning(TorchRecordWarning):
    """An option was given that has no effect on this source (e.g. ``num_workers`` with an iterator)."""


class MissingDatasetKeyWarning(TorchRecordWarning):
    """A dataset key asked of a converted robomimic set is absent from its source file.

    ``SequenceDataset`` and ``WindowDataset`` then give float32 zeros ``[T, 1]``
    for it under a frame cache mode, as robomimic 0.3.0 does; leave the key out
    of ``dataset_keys`` to silence it.
    """
