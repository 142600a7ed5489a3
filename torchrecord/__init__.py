"""torchrecord: pre-shuffled TensorProtos records in LMDB, read fast by PyTorch.

Write once with :func:`write_record`, read in a DataLoader with
:class:`RecordDataset`, or randomly with :class:`RecordFile`.
"""

from torchrecord._resume import loader_position
from torchrecord._version import __version__
from torchrecord.dataset import RecordDataset
from torchrecord.errors import TorchRecordError
from torchrecord.record_file import RecordFile
from torchrecord.schema import Field, Schema
from torchrecord.verify import VerifyReport, verify
from torchrecord.writer import write_record

__all__ = [
    "Field",
    "RecordDataset",
    "RecordFile",
    "Schema",
    "TorchRecordError",
    "VerifyReport",
    "__version__",
    "loader_position",
    "verify",
    "write_record",
]
