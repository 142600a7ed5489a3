"""Transforms for ``RecordDataset(transform=...)``: they run in the readers, after shuffling.

Record sets made by :func:`torchrecord.convert.from_image_folder` and
:func:`~torchrecord.convert.from_list_file` store images encoded (PNG, JPEG...),
so the shuffle buffer holds compact bytes; :func:`decode_image` turns them into
tensors as the samples leave it::

    ds = RecordDataset("train.tr", transform=decode_image, batch_size=64)

It needs Pillow (``pip install pillow``, or the ``images`` extra). It is a module-level
function, so it pickles into spawn workers; ``functools.partial(decode_image,
mode="L")`` does too.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from torchrecord._core.extras import install_hint
from torchrecord.errors import ArgumentTypeError, CorruptRecordError, MissingDependencyError

__all__ = ["decode_image"]


def decode_image(sample: Any, *, key: str = "image", mode: str | None = "RGB") -> Any:
    """Decode encoded image bytes into a ``uint8`` tensor of shape ``[C, H, W]``.

    Every image is converted to RGB by default, so a grayscale image comes out
    with 3 channels; ``mode="L"`` gives one.

    Args:
        sample: the encoded bytes themselves, or a dict whose ``key`` holds them
            (the converters' ``{"image": ..., "label": ...}``), or a tuple/list whose
            first element holds them. Dicts, tuples and lists come back as new
            objects of the same kind with only the image replaced.
        key: the dict key of the image.
        mode: the Pillow mode to convert to: ``"RGB"`` (3 channels, the default),
            ``"L"`` (1 channel), ``"RGBA"``...; ``None`` keeps each file's own mode,
            so the channel count (and, for 16-bit files, the dtype) may vary
            between images, which breaks batching.

    Raises:
        ImportError: Pillow is not installed.
        CorruptRecordError: the bytes are not a decodable image.
        TypeError: the sample holds no bytes where the image should be.
    """
    if isinstance(sample, dict):
        return {**sample, key: _decode(sample[key], mode)}
    if isinstance(sample, (tuple, list)) and sample:
        first = _decode(sample[0], mode)
        return (first, *sample[1:]) if isinstance(sample, tuple) else [first, *sample[1:]]
    return _decode(sample, mode)


def _decode(data: Any, mode: str | None) -> torch.Tensor:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"decode_image expects encoded image bytes, got {type(data).__name__}")
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError(f"decode_image needs Pillow: {install_hint('images')}") from exc
    try:
        with Image.open(io.BytesIO(data)) as image:
            converted = image.convert(mode) if mode is not None and image.mode != mode else image
            array = np.array(converted)  # a copy: writable, owned by the tensor
    except Exception as exc:  # Pillow raises many unrelated types for bad data
        head = bytes(data[:8])
        raise CorruptRecordError(
            f"cannot decode an image of {len(data)} bytes starting with {head!r} "
            f"({type(exc).__name__}: {exc}); convert with image checks on to catch bad files early"
        ) from None
    tensor = torch.from_numpy(array)
    if tensor.dim() == 2:
        return tensor.unsqueeze(0)
    return tensor.permute(2, 0, 1).contiguous()
