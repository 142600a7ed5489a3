"""torchrecord: pre-shuffled TensorProtos records in LMDB, read fast by PyTorch.

Write once with :func:`write_record` (or push samples into a
:class:`RecordWriter`, or write shards in parallel with :func:`write_shard` and
:func:`finalize_shards`), read in a DataLoader with :class:`RecordDataset`, or
randomly with :class:`RecordFile`; mix many sets by weight with
:class:`MixedDataset`; for data that fits in memory, :func:`load` it
and draw batches with :class:`BatchIter` or :class:`GroupBatchIter`.
"""

from torchrecord._resume import loader_position
from torchrecord._sharded import ShardedSet
from torchrecord._summary import SkippedSample, WriteSummary
from torchrecord._version import __version__
from torchrecord.dataset import RecordDataset
from torchrecord.errors import TorchRecordError
from torchrecord.memory import BatchIter, GroupBatchIter, SampleList, load
from torchrecord.mixed import MixedDataset
from torchrecord.record_file import RecordFile
from torchrecord.robomimic import SequenceDataset, WindowDataset
from torchrecord.schema import Field, Schema
from torchrecord.shards import finalize_shards, write_shard
from torchrecord.stream_loader import StreamLoader
from torchrecord.streams import StreamDataset
from torchrecord.verify import VerifyReport, verify
from torchrecord.writer import RecordWriter, write_record

__all__ = [
    "BatchIter",
    "Field",
    "GroupBatchIter",
    "MixedDataset",
    "RecordDataset",
    "RecordFile",
    "RecordWriter",
    "SampleList",
    "Schema",
    "SequenceDataset",
    "ShardedSet",
    "SkippedSample",
    "StreamDataset",
    "StreamLoader",
    "TorchRecordError",
    "VerifyReport",
    "WindowDataset",
    "WriteSummary",
    "__version__",
    "finalize_shards",
    "load",
    "loader_position",
    "verify",
    "write_record",
    "write_shard",
]
