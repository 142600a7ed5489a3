"""Compression codecs: one module per codec, each registered below by one line.

Adding a codec (the recipe in docs/ARCHITECTURE.md, kept true by
tests/core/test_codecs.py): its module here (a :class:`CompressionCodec`
subclass), its ``register`` line and its name in :data:`Codec`, its
``StorageType`` value in proto/torchrecord.proto (then ``scripts/gen_proto.py``),
its row in docs/FORMAT.md and its section in docs/compression.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from torchrecord._core.compression.base import EXTRA_HINT, CompressionCodec, require
from torchrecord._core.compression.lz4 import Lz4
from torchrecord._core.compression.zstd import Zstd
from torchrecord.errors import InternalError

__all__ = [
    "BY_STORAGE",
    "CODECS",
    "Codec",
    "Compression",
    "CompressionCodec",
    "EXTRA_HINT",
    "choices",
    "register",
    "require",
]

#: A codec's name (``compression=``), one per registered codec.
Codec = Literal["zstd", "lz4"]
#: ``compression=``: one codec for every numeric field, or field name -> codec or None.
Compression = Codec | Mapping[str, Codec | None] | None

#: The registry: codec name -> codec, in the order messages list them.
CODECS: dict[str, CompressionCodec] = {}
#: The same codecs by their ``storage_type`` (how a record marks a payload compressed).
BY_STORAGE: dict[int, CompressionCodec] = {}


def register(codec: CompressionCodec) -> CompressionCodec:
    """Add ``codec`` to the registry (its name and storage type must be new); returns it."""
    if codec.name in CODECS or codec.storage_type in BY_STORAGE:
        raise InternalError(f"{codec!r} clashes with a registered codec")
    CODECS[codec.name] = codec
    BY_STORAGE[int(codec.storage_type)] = codec
    return codec


def choices(sep: str = ", ") -> str:
    """The codec names quoted for a message: ``'zstd', 'lz4'`` (``sep=" or "``: ``'zstd' or 'lz4'``)."""
    return sep.join(repr(name) for name in CODECS)


register(Zstd())
register(Lz4())
