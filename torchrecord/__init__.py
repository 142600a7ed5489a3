"""torchrecord: pre-shuffled TensorProtos records in LMDB, read fast by PyTorch.

Write once with :func:`write_record` (or push samples into a
:class:`RecordWriter`), read in a DataLoader with :class:`RecordDataset`, or
randomly with :class:`RecordFile`.
"""

from torchrecord._version import __version__
from torchrecord.dataset import RecordDataset
from torchrecord.errors import TorchRecordError
from torchrecord.record_file import RecordFile
from torchrecord.schema import Field, Schema
from torchrecord.verify import VerifyReport, verify
from torchrecord.writer import RecordWriter, write_record

__all__ = [
    "Field",
    "RecordDataset",
    "RecordFile",
    "RecordWriter",
    "Schema",
    "TorchRecordError",
    "VerifyReport",
    "__version__",
    "verify",
    "write_record",
]
