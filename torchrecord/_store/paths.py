"""Paths of record sets as users give them: ``~`` expanded, and what a path that holds no set holds instead.

Readers (``RecordFile``, ``open_set`` and every reader through it) and ``write_record``
take ``~/sets/train.tr`` as the shell would. :func:`require_file` is the check a
``RecordFile`` makes when it is made: one ``stat``, no LMDB handle (nothing that
would cross a fork), so a missing file fails there and not at first use.
:func:`folder_hint` names what a folder given as a set holds when it is a folder of
record sets (``from_hf``'s one set per split) or a Hugging Face dataset saved with
``save_to_disk``, and what to give instead.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from torchrecord._store.lmdb_format import MDB_MAGIC, PAGEHDRSZ
from torchrecord._store.record_set import MANIFEST_NAME
from torchrecord.errors import NotARecordSetError, RecordNotFoundError

__all__ = ["expand", "folder_hint", "require_file"]

#: the files ``save_to_disk`` writes: a DatasetDict's, then a Dataset's
_HF_DICT, _HF_DATASET = "dataset_dict.json", "state.json"
_LOOKED_AT = 200  # entries of a folder looked at for record sets


def expand(path: Any) -> str:
    """``path`` (str, bytes or path-like) as a str, with a leading ``~`` or ``~user`` expanded."""
    return os.path.expanduser(os.fsdecode(path))


def require_file(path: str) -> None:
    """RecordNotFoundError for a path where nothing is, NotARecordSetError for one that runs through a file."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    except NotADirectoryError:
        raise NotARecordSetError(_through_a_file(path)) from None


def _through_a_file(path: str) -> str:
    """What ``path`` holds when a part of it is a file, not a folder (``set.tr/`` or ``set.tr/x``)."""
    whole = path.rstrip("/" + os.sep)
    if whole != path and os.path.isfile(whole):
        return (
            f"{path}: {whole} is a file (a record set is one file), not a folder; "
            f"open it without the trailing {path[len(whole) :]!r}: {whole!r}"
        )
    head = os.path.dirname(whole)
    while head and not os.path.isfile(head):
        head = os.path.dirname(head)
    return f"{path}: {head or whole} is a file, not a folder, so nothing is under it"


def folder_hint(path: str) -> str | None:
    """The error message for a local folder without a manifest that holds record sets or a saved HF dataset."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return None
    if os.path.exists(os.path.join(path, _HF_DICT)) or os.path.exists(os.path.join(path, _HF_DATASET)):
        return _hugging_face(path)
    try:
        with os.scandir(path) as entries:
            files = sorted(e.name for _, e in zip(range(_LOOKED_AT), entries) if e.is_file())
    except OSError:
        return None
    if any(n.startswith("shard-") and "-of-" in n for n in files) or "data.mdb" in files:
        return None  # the shards of a set never finalized, or an LMDB environment: their own messages say so
    sets = [n for n in files if _is_lmdb(os.path.join(path, n))]
    if not sets:
        return None
    shown = ", ".join(sets[:5]) + (", ..." if len(sets) > 5 else "")
    return (
        f"{path}: is a folder of {len(sets)} record set{'s' if len(sets) > 1 else ''} ({shown}; from_hf writes one "
        f"per split), not one set: give one of them, e.g. {os.path.join(path, _first(sets))}"
    )


def _hugging_face(path: str) -> str:
    if not os.path.exists(os.path.join(path, _HF_DICT)):
        return (
            f"{path}: is a Hugging Face dataset saved with save_to_disk, not a record set; convert it: "
            f"torchrecord convert {path} OUT.tr (in Python: torchrecord.convert.from_hf)"
        )
    with os.scandir(path) as entries:
        splits = sorted(e.name for e in entries if e.is_dir())
    return (
        f"{path}: is a Hugging Face DatasetDict saved with save_to_disk (splits: {', '.join(splits) or 'none'}), "
        f"not a record set; convert a split: torchrecord convert {path} OUT.tr --split {_first(splits)}, or every "
        f"split, one set each: torchrecord convert {path} OUT (in Python: torchrecord.convert.from_hf)"
    )


def _first(names: list[str]) -> str:
    """The name to show in an example: ``train`` where there is one."""
    return "train" if "train" in names or not names else names[0]


def _is_lmdb(file: str) -> bool:
    """True when ``file`` starts with an LMDB meta page (a record-set file, or another LMDB file)."""
    try:
        with open(file, "rb") as f:
            head = f.read(PAGEHDRSZ + 4)
    except OSError:
        return False
    return len(head) == PAGEHDRSZ + 4 and struct.unpack_from("<I", head, PAGEHDRSZ)[0] == MDB_MAGIC
