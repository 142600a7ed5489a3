"""What a compression codec is: the base class every member of the registry implements, and cramjam.

A codec compresses one numeric payload (a field's ``raw_data``) into the bytes
a record stores, and decompresses them straight into a slice of the reader's
buffer. It says which ``TensorProto.StorageType`` value marks a payload it
compressed (its id in the on-disk format, see docs/FORMAT.md), how far one
stored byte can expand, and which levels it takes.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from typing import Any, ClassVar

from torchrecord._core.extras import install_hint
from torchrecord.errors import ArgumentError, MissingDependencyError

__all__ = ["CompressionCodec", "Compressor", "Decompressor", "EXTRA_HINT", "require"]

#: What to install for compression.
EXTRA_HINT = install_hint("compress")
_MIN_CRAMJAM = (2, 11)

#: raw bytes -> the bytes a record stores
Compressor = Callable[[Any], bytes]
#: (stored bytes, writable buffer of the raw size) -> bytes written; raises the library's error on damage
Decompressor = Callable[[Any, Any], int]


def require(what: str) -> Any:
    """The cramjam module, or an ImportError naming the extra to install (``what``: who needs it)."""
    try:
        cramjam = importlib.import_module("cramjam")
    except ImportError as exc:
        raise MissingDependencyError(f"{what} needs cramjam: {EXTRA_HINT}") from exc
    version = tuple(int(p) for p in str(getattr(cramjam, "__version__", "0")).split(".")[:2] if p.isdigit())
    if version < _MIN_CRAMJAM:
        # older releases cannot decompress an LZ4 block without a size prefix into a buffer
        raise MissingDependencyError(f"{what} needs cramjam 2.11 or newer (found {cramjam.__version__}): {EXTRA_HINT}")
    return cramjam


class CompressionCodec(abc.ABC):
    """One codec of the registry (``torchrecord/_core/compression/__init__.py``).

    A subclass sets the class attributes below and builds its two functions
    from the library :meth:`library` returns; the readers and the writer call
    those functions in their loops, so they are looked up once per field, not
    per record.
    """

    #: the name ``compression=`` takes, stored in the schema and the metadata
    name: ClassVar[str]
    #: its ``TensorProto.StorageType`` value in proto/torchrecord.proto: the codec's id on disk
    storage_type: ClassVar[int]
    #: the most raw bytes one stored byte can expand to; a payload claiming more is refused before allocating
    max_ratio: ClassVar[int]
    #: ``compression_level=``: the levels it takes, and how a message names them
    levels: ClassVar[tuple[int, int]]
    levels_name: ClassVar[str]
    #: the level used (and reported) when none is given; None: the codec's own default mode
    default_level: ClassVar[int | None] = None

    def library(self, what: str) -> Any:
        """The module that runs this codec (cramjam); an ImportError naming the extra (``what``: who needs it)."""
        return require(what)

    @abc.abstractmethod
    def compressor(self, library: Any, level: int | None) -> Compressor:
        """The function that compresses one payload at ``level`` (None: :attr:`default_level`)."""

    @abc.abstractmethod
    def decompressor(self, library: Any) -> Decompressor:
        """The function that decompresses one payload straight into a writable buffer of its raw size."""

    def check_level(self, level: int) -> None:
        """ArgumentError unless ``level`` is one of :attr:`levels`."""
        low, high = self.levels
        if not low <= level <= high:
            raise ArgumentError(f"compression_level {level} is outside {self.levels_name} {low} .. {high}")

    def stated_size(self, data: Any) -> int | None:
        """The raw size ``data``'s own header states, None when it states none (the default)."""
        return None

    def __repr__(self) -> str:
        return f"<codec {self.name!r}, storage_type {self.storage_type}>"
