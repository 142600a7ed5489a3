"""Image sources: a class-per-folder tree, or a list file of ``path label`` lines.

Both store each image file's encoded bytes as they are (no re-encoding, so no
quality loss and the smallest records) with its integer label and the file's
path, as the sample ``{"image": bytes, "label": int, "path": str}`` (the path is
relative to the folder or list file, ``/``-separated, so a prediction can be
traced back to its file; ``keep_paths=False`` leaves it out);
:func:`torchrecord.transforms.decode_image` turns the bytes into a tensor when
reading, after shuffling. A folder is scanned for files with an image extension
(:data:`IMG_EXTENSIONS`, like torchvision's ``ImageFolder``), so ``README.txt``
or ``Thumbs.db`` are left alone. Files are read in ``num_workers`` DataLoader
worker processes (write_record's ``num_workers``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from typing_extensions import Unpack

from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import Converter, ConvertOptions, Option, Target, existing, require, write
from torchrecord.errors import ArgumentError, SourceError

__all__ = [
    "FOLDER",
    "IMG_EXTENSIONS",
    "ImageFiles",
    "LIST",
    "from_image_folder",
    "from_list_file",
    "image_extensions",
    "scan_folder",
    "scan_list_file",
]

#: The file extensions an image folder is scanned for (case-insensitive): torchvision's
#: ``IMG_EXTENSIONS`` and ``.gif``.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")

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


def image_extensions(extensions: Sequence[str] | None) -> tuple[str, ...] | None:
    """Normalized extensions (lower case, with the dot); None means every file."""
    if extensions is None:
        return None
    if isinstance(extensions, str):
        extensions = [extensions]
    out = []
    for ext in extensions:
        if not isinstance(ext, str) or not ext.strip(". "):
            raise ArgumentError(f"extensions: {ext!r} is not a file extension such as '.jpg'")
        ext = ext.strip().lower()
        out.append(ext if ext.startswith(".") else "." + ext)
    if not out:
        raise ArgumentError("extensions is empty; pass None to take every file")
    return tuple(out)


class ImageFiles:
    """Map-style dataset: sample ``i`` is ``{"image": <bytes of files[i]>, "label": labels[i]}``.

    With ``names``, the sample also has ``"path": names[i]`` (the file as the
    user knows it, e.g. relative to the image folder). Picklable, so DataLoader
    workers (fork or spawn) read the files in parallel. A file that cannot be
    read or is no image raises SourceError naming it, which write_record reports,
    or skips with ``on_error="skip"`` (its error, naming the file, is kept in the
    write summary).
    """

    def __init__(
        self, files: list[str], labels: list[int], check_images: bool = True, names: list[str] | None = None
    ) -> None:
        if len(files) != len(labels):
            raise ArgumentError(f"{len(files)} files but {len(labels)} labels")
        if names is not None and len(names) != len(files):
            raise ArgumentError(f"{len(files)} files but {len(names)} names")
        self.files = files
        self.labels = labels
        self.check_images = check_images
        self.names = names

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
        if self.names is None:
            return {"image": data, "label": self.labels[index]}
        return {"image": data, "label": self.labels[index], "path": self.names[index]}


def scan_folder(root: str, extensions: Sequence[str] | None = IMG_EXTENSIONS) -> tuple[list[str], list[int], list[str]]:
    """The files, labels and class names of a class-per-folder tree ``root/<class>/.../<file>``.

    Classes are the sorted names of root's sub-directories (label = position);
    every file below a class folder, at any depth, whose name ends with one of
    ``extensions`` (case-insensitive; None: every file) is a sample of that
    class, in sorted order. Hidden files and folders (``.name``) and files
    directly in root are ignored.
    """
    wanted = image_extensions(extensions)
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SourceError(
            f"{root}: no class folders; an image folder holds one folder per class: "
            f"{os.path.join(root, '<class>', '<image>')}"
        )
    files: list[str] = []
    labels: list[int] = []
    ignored = 0
    for label, name in enumerate(classes):
        for directory, subdirs, names in os.walk(os.path.join(root, name), followlinks=True):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for file in sorted(names):
                if file.startswith("."):
                    continue
                if wanted is not None and not file.lower().endswith(wanted):
                    ignored += 1
                    continue
                files.append(os.path.join(directory, file))
                labels.append(label)
    if not files:
        shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        if ignored:
            raise SourceError(
                f"{root}: the class folders ({shown}) hold {ignored} files but none with an image extension "
                f"({', '.join(wanted or ())}); pass extensions=[...] (--extensions) to choose others, or "
                "extensions=None (--extensions '*') to take every file"
            )
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


@spell_out(ConvertOptions)
def from_image_folder(
    root: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    check_images: bool = True,
    extensions: Sequence[str] | None = IMG_EXTENSIONS,
    keep_paths: bool = True,
    **options: Unpack[ConvertOptions],
) -> RecordFile:
    """Convert a class-per-folder image tree (``root/<class>/<image>``) into a record set.

    Each sample is ``{"image": <encoded file bytes>, "label": <class index>,
    "path": <file path relative to root, "/"-separated>}``; the class names, in
    label order, are stored as ``user_metadata["classes"]``. See
    :func:`scan_folder` for which files count.

    Args:
        root: the folder holding one sub-folder per class.
        path: the record set to write.
        check_images: decode every image with Pillow while converting (needs the
            ``images`` extra), so damaged files are caught now and not in the middle
            of training; ``False`` only checks each file's signature.
        extensions: the file extensions that count as images (default
            :data:`IMG_EXTENSIONS`, case-insensitive); other files are left
            alone. None takes every file.
        keep_paths: store each file's relative path as the ``"path"`` field, to
            trace a sample back to its file; ``False`` leaves it out.
        **options: the write options and ``shard``/``num_shards``
            (:class:`~torchrecord.convert.ConvertOptions`):
            ``num_workers`` reads the files in worker processes, and
            ``on_error="skip"`` leaves bad files out, each named in
            ``write_summary.skipped_samples``.

    Raises:
        SourceError: root is missing or holds no image files, or a file is bad (naming it).
        ImportError: ``check_images`` is true and Pillow is not installed.
    """
    target = Target.of(path, options, "from_image_folder")
    source = existing(root, directory=True)
    _pillow_unless(check_images)
    files, labels, classes = scan_folder(source, extensions)
    names = [_relative(f, source) for f in files] if keep_paths else None
    meta = {"source_format": "folder", "classes": classes}
    return write(ImageFiles(files, labels, check_images, names), target, meta)


@spell_out(ConvertOptions)
def from_list_file(
    list_file: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    check_images: bool = True,
    keep_paths: bool = True,
    **options: Unpack[ConvertOptions],
) -> RecordFile:
    """Convert the images named by a list file of ``<path> <label>`` lines into a record set.

    Each sample is ``{"image": <encoded file bytes>, "label": <label>, "path":
    <the file's path relative to the list file's directory>}`` (absolute paths
    stay absolute). Every listed file is converted, whatever its extension; see
    :func:`scan_list_file`. Other arguments as for :func:`from_image_folder`.
    """
    target = Target.of(path, options, "from_list_file")
    source = existing(list_file)
    _pillow_unless(check_images)
    files, labels = scan_list_file(source)
    base = os.path.dirname(os.path.abspath(source))
    names = [_relative(f, base) for f in files] if keep_paths else None
    meta = {"source_format": "list"}
    return write(ImageFiles(files, labels, check_images, names), target, meta)


def _relative(file: str, base: str) -> str:
    """``file`` relative to ``base`` with ``/`` separators; files outside ``base`` stay as they are."""
    full = os.path.abspath(file)
    if not full.startswith(os.path.abspath(base) + os.sep):
        return file
    return os.path.relpath(full, os.path.abspath(base)).replace(os.sep, "/")


#: ``check_images``, ``keep_paths`` and ``extensions``: the image converters' options.
CHECK_IMAGES = Option(
    "check_images",
    True,
    "bool",
    "--no-check-images",
    "images: check file signatures only, do not decode each image (faster; no Pillow needed)",
    {"action": "store_false"},
)
KEEP_PATHS = Option(
    "keep_paths",
    True,
    "bool",
    "--no-paths",
    "images: do not store each file's relative path as the 'path' field",
    {"action": "store_false"},
)
EXTENSIONS = Option(
    "extensions",
    IMG_EXTENSIONS,
    "Sequence[str] | None",
    "--extensions",
    "folder: comma-separated image file extensions to take, or '*' for every file "
    f"(default: {','.join(IMG_EXTENSIONS)})",
    {"type": lambda text: None if text.strip() == "*" else _extension_list(text), "metavar": "LIST"},
)


def _extension_list(text: str) -> list[str]:
    names = [e.strip() for e in text.split(",") if e.strip()]
    if not names:
        raise ValueError("expected extensions such as .jpg,.png, or '*' for every file")
    return names


FOLDER = Converter(
    "folder",
    from_image_folder,
    "root/<class>/<image>: samples {'image': bytes, 'label': class index, 'path': file path relative "
    "to SOURCE}, class names in the user metadata ('classes'); only files with an image extension "
    "(see --extensions)",
    lambda probe: probe.is_dir,
    rank=90,  # any folder that no other format claims
    options=(CHECK_IMAGES, EXTENSIONS, KEEP_PATHS),
)
LIST = Converter(
    "list",
    from_list_file,
    "text file of '<path> <label>' lines, paths relative to the list file",
    lambda probe: not probe.is_dir and bool(probe.head) and b"\0" not in probe.head,
    rank=100,  # any text file that no other format claims
    options=(CHECK_IMAGES, KEEP_PATHS),
)
