"""torchrecord: pre-shuffled TensorProtos records in LMDB, read fast by PyTorch.

Write once with :func:`write_record` (or push samples into a
:class:`RecordWriter`), read in a DataLoader with :class:`RecordDataset`, or
randomly with :class:`RecordFile`; for data that fits in memory, :func:`load` it
and draw batches with :class:`BatchIter` or :class:`GroupBatchIter`.
"""

from torchrecord._resume import loader_position
from torchrecord._summary import SkippedSample, WriteSummary
from torchrecord._version import __version__
from torchrecord.dataset import RecordDataset
from torchrecord.errors import TorchRecordError
from torchrecord.memory import BatchIter, GroupBatchIter, SampleList, load
from torchrecord.record_file import RecordFile
from torchrecord.schema import Field, Schema
from torchrecord.streams import StreamDataset
from torchrecord.verify import VerifyReport, verify
from torchrecord.writer import RecordWriter, write_record

__all__ = [
    "BatchIter",
    "Field",
    "GroupBatchIter",
    "RecordDataset",
    "RecordFile",
    "RecordWriter",
    "SampleList",
    "Schema",
    "SkippedSample",
    "StreamDataset",
    "TorchRecordError",
    "VerifyReport",
    "WriteSummary",
    "__version__",
    "load",
    "loader_position",
    "verify",
    "write_record",
]
