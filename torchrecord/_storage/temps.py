"""Temporary file names: one spelling for every hidden temporary torchrecord writes, one parser.

A temporary of ``NAME`` is ``.NAME.tmp-PID-TOKEN`` (eight hex digits of token) in ``NAME``'s own
folder, so that it is on the same file system and the final move is atomic; files of the same
write add a suffix (``.lock``, ``-lock``, a spool's name). Writers of record sets
(``_write/publish.py``), of manifests and notes (``_shards/manifest.py``) and the shard cache
(``_storage/cache.py``) all name them here, and whoever tidies up recognises them here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["TempName", "parse_temp", "temp_name", "temp_path"]

_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})(?P<suffix>.*)$", re.DOTALL)


@dataclass(frozen=True)
class TempName:
    """What a temporary's file name says: the file it stands for, the writer's PID, the write's base name."""

    name: str
    pid: int
    base: str  # ``.NAME.tmp-PID-TOKEN``: every file of one write starts with it
    suffix: str  # what follows the base ("" for the temporary itself)


def temp_name(name: str) -> str:
    """A fresh temporary name for ``name`` (a file name, no folder): ``.NAME.tmp-PID-TOKEN``."""
    return f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"


def temp_path(target: str) -> str:
    """A fresh temporary path beside ``target`` (same folder)."""
    directory, name = os.path.split(os.path.abspath(target))
    return os.path.join(directory, temp_name(name))


def parse_temp(entry: str) -> TempName | None:
    """What the file name ``entry`` says if it is a temporary (or a file of one write), else None."""
    match = _TEMP.match(entry)
    if match is None:
        return None
    base = entry[: len(entry) - len(match.group("suffix"))]
    return TempName(match.group("name"), int(match.group("pid")), base, match.group("suffix"))
