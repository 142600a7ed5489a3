"""Image sources: a class-per-folder tree, or a list file of ``path label`` lines.

Both store each image file's encoded bytes as they are (no re-encoding, so no
quality loss and the smallest records) with its integer label, as the sample
``{"image": bytes, "label": int}``; :func:`torchrecord.transforms.decode_image`
turns the bytes into a tensor when reading, after shuffling. Files are read in
``num_workers`` DataLoader worker processes (write_record's ``num_workers``).
"""

from __future__ import annotations

import io
import os
from typing import Any

from torchrecord.convert._common import existing, require, write
from torchrecord.errors import SourceError
from torchrecord.record_file import RecordFile

__all__ = ["ImageFiles", "from_image_folder", "from_list_file", "scan_folder", "scan_list_file"]

_FIX = "fix or remove the file, or skip bad files (--skip-bad, on_error='skip')"

# What check_images=False accepts: the leading bytes of the common formats.
_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


def _has_image_signature(data: bytes) -> bool:
    if data.startswith(_SIGNATURES):
        return True
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return True
    return len(data) > 2 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace()  # PNM


def check_image(path: str, data: bytes, decode: bool) -> None:
    """Raise SourceError naming ``path`` unless ``data`` is an image.

    ``decode=True`` decodes it fully with Pillow (catches truncated and damaged
    files); ``False`` only checks the signature of PNG, JPEG, GIF, BMP, TIFF, WebP
    and PNM files.
    """
    if not data:
        raise SourceError(f"{path}: empty file; {_FIX}")
    if not decode:
        if not _has_image_signature(data):
            raise SourceError(
                f"{path}: not a PNG, JPEG, GIF, BMP, TIFF, WebP or PNM image (starts with {data[:8]!r}); {_FIX}"
            )
        return
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception as exc:  # Pillow raises many unrelated types for bad data
        raise SourceError(f"{path}: not a decodable image ({type(exc).__name__}: {exc}); {_FIX}") from None


class ImageFiles:
    """Map-style dataset: sample ``i`` is ``{"image": <bytes of files[i]>, "label": labels[i]}``.

    Picklable, so DataLoader workers (fork or spawn) read the files in parallel.
    A file that cannot be read or is no image raises SourceError naming it, which
    write_record reports, or skips with ``on_error="skip"``.
    """

    def __init__(self, files: list[str], labels: list[int], check_images: bool = True) -> None:
        if len(files) != len(labels):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        self.files = files
        self.labels = labels
        self.check_images = check_images

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path = self.files[index]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SourceError(f"{path}: cannot read it ({exc.strerror or exc}); {_FIX}") from None
        check_image(path, data, self.check_images)
        return {"image": data, "label": self.labels[index]}


def scan_folder(root: str) -> tuple[list[str], list[int], list[str]]:
    """The files, labels and class names of a class-per-folder tree ``root/<class>/.../<file>``.

    Classes are the sorted names of root's sub-directories (label = position);
    every file below a class folder, at any depth, is a sample of that class, in
    sorted order. Hidden files and folders (``.name``) and files directly in root
    are ignored.
    """
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SourceError(
            f"{root}: no class folders; an image folder holds one folder per class: "
            f"{os.path.join(root, '<class>', '<image>')}"
        )
    files: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for directory, subdirs, names in os.walk(os.path.join(root, name), followlinks=True):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for file in sorted(names):
                if not file.startswith("."):
                    files.append(os.path.join(directory, file))
                    labels.append(label)
    if not files:
        shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        raise SourceError(f"{root}: the class folders ({shown}) hold no files; there is nothing to convert")
    return files, labels, classes


def scan_list_file(list_file: str) -> tuple[list[str], list[int]]:
    """The files and labels of a list file: one ``<path> <integer label>`` per line.

    Paths are relative to the list file's directory (absolute paths stay as they
    are) and may contain spaces (the label is the last word). Blank lines are ignored.
    """
    base = os.path.dirname(os.path.abspath(list_file))
    files: list[str] = []
    labels: list[int] = []
    try:
        with open(list_file, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                text = line.strip()
                if not text:
                    continue
                parts = text.rsplit(None, 1)
                if len(parts) != 2:
                    raise SourceError(f"{list_file}, line {number}: expected '<path> <label>', got {text!r}")
                try:
                    label = int(parts[1])
                except ValueError:
                    raise SourceError(f"{list_file}, line {number}: label {parts[1]!r} is not an integer") from None
                files.append(os.path.join(base, parts[0]))
                labels.append(label)
    except UnicodeDecodeError as exc:
        raise SourceError(f"{list_file}: not a UTF-8 text file of '<path> <label>' lines ({exc})") from None
    if not files:
        raise SourceError(f"{list_file}: lists no files; expected one '<path> <label>' per line")
    return files, labels


def _pillow_unless(check_images: bool) -> None:
    if check_images:
        require("PIL.Image", "images", "checking images (check_images=True, the default)")


def from_image_folder(
    root: str | os.PathLike[str], path: str | os.PathLike[str], *, check_images: bool = True, **kwargs: Any
) -> RecordFile:
    """Convert a class-per-folder image tree (``root/<class>/<image>``) into a record set.

    Each sample is ``{"image": <encoded file bytes>, "label": <class index>}``;
    the class names, in label order, are stored as ``user_metadata["classes"]``.
    See :func:`scan_folder` for which files count.

    Args:
        root: the folder holding one sub-folder per class.
        path: the record set to write.
        check_images: decode every image with Pillow while converting (needs the
            ``images`` extra), so damaged files are caught now and not in the middle
            of training; ``False`` only checks each file's signature.
        **kwargs: passed to :func:`torchrecord.write_record` (``shuffle``, ``seed``,
            ``num_workers`` to read files in parallel, ``on_error="skip"`` to leave
            bad files out, ``overwrite``, ``progress``, ``metadata``...).

    Raises:
        SourceError: root is missing or holds no files, or a file is bad (naming it).
        ImportError: ``check_images`` is true and Pillow is not installed.
    """
    source = existing(root, directory=True)
    _pillow_unless(check_images)
    files, labels, classes = scan_folder(source)
    meta = {"source_format": "folder", "classes": classes}
    return write(ImageFiles(files, labels, check_images), path, meta, kwargs)


def from_list_file(
    list_file: str | os.PathLike[str], path: str | os.PathLike[str], *, check_images: bool = True, **kwargs: Any
) -> RecordFile:
    """Convert the images named by a list file of ``<path> <label>`` lines into a record set.

    Each sample is ``{"image": <encoded file bytes>, "label": <label>}``. Paths are
    relative to the list file's directory; see :func:`scan_list_file`. Arguments as
    for :func:`from_image_folder`.
    """
    source = existing(list_file)
    _pillow_unless(check_images)
    files, labels = scan_list_file(source)
    return write(ImageFiles(files, labels, check_images), path, {"source_format": "list"}, kwargs)
