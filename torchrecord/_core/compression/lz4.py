"""LZ4: each payload one LZ4 block without a size prefix (the size follows from the schema), through cramjam.

Fast mode by default, or levels 1..12 of LZ4's high-compression mode. cramjam's
LZ4 frame decompression was much slower than the block; 2.11 is the first
cramjam whose ``lz4.decompress_block_into`` takes a block without a size prefix.
"""

from __future__ import annotations

from typing import Any

from torchrecord._core.compression.base import CompressionCodec, Compressor, Decompressor
from torchrecord._proto import torchrecord_pb2 as pb

__all__ = ["Lz4"]


class Lz4(CompressionCodec):
    """LZ4 decompresses faster than zstd and compresses less; a block carries no checksum or size."""

    name = "lz4"
    storage_type = pb.TensorProto.StorageType.LZ4
    #: match lengths grow by 255 per extension byte
    max_ratio = 256
    levels = (1, 12)
    levels_name = "LZ4's high-compression levels"

    def compressor(self, library: Any, level: int | None) -> Compressor:
        block = library.lz4.compress_block
        if level is None:
            return lambda data: bytes(block(data, store_size=False))
        return lambda data: bytes(block(data, mode="high_compression", compression=level, store_size=False))

    def decompressor(self, library: Any) -> Decompressor:
        return library.lz4.decompress_block_into  # type: ignore[no-any-return]
