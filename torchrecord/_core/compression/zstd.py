"""zstd: each payload one zstd frame (RFC 8878), through cramjam; level -7..22, default 3."""

from __future__ import annotations

from typing import Any

from torchrecord._core.compression.base import CompressionCodec, Compressor, Decompressor
from torchrecord._proto import torchrecord_pb2 as pb

__all__ = ["Zstd", "zstd_content_size"]

_MAGIC = b"\x28\xb5\x2f\xfd"


class Zstd(CompressionCodec):
    """zstd compresses more than LZ4; a frame states its content size, which readers check."""

    name = "zstd"
    storage_type = pb.TensorProto.StorageType.ZSTD
    #: a zstd block of 3 header bytes and 1 RLE byte holds up to 128 KiB
    max_ratio = 32768
    levels = (-7, 22)
    levels_name = "zstd's levels"
    #: cramjam's own default, 11, is much slower to write
    default_level = 3

    def compressor(self, library: Any, level: int | None) -> Compressor:
        compress = library.zstd.compress
        chosen = self.default_level if level is None else level
        return lambda data: bytes(compress(data, level=chosen))

    def decompressor(self, library: Any) -> Decompressor:
        return library.zstd.decompress_into  # type: ignore[no-any-return]

    def stated_size(self, data: Any) -> int | None:
        return zstd_content_size(data)


def zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame's header states, None when it states none (or is not a frame)."""
    head = bytes(data[:18])
    if len(head) < 6 or head[:4] != _MAGIC:
        return None
    descriptor = head[4]
    single_segment = descriptor >> 5 & 1
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    dict_bytes = (0, 1, 2, 4)[descriptor & 3]
    at = 5 + (0 if single_segment else 1) + dict_bytes
    if fcs_bytes == 0 or len(head) < at + fcs_bytes:
        return None
    value = int.from_bytes(head[at : at + fcs_bytes], "little")
    return value + 256 if fcs_bytes == 2 else value
