"""``check=``: integrity on read. ``"structure"``: LMDB's page structure checked once per file per process,
before liblmdb reads it; ``"checksums"``: each record's CRC-32 checked as it is read; ``"full"``: both.

liblmdb trusts the file it maps: damage to its page structure can kill the
reading process (SIGSEGV, SIGBUS, an assertion's SIGABRT). A reader of files of
unknown provenance turns on the check; :func:`ensure` then runs
:func:`~torchrecord._store.lmdb_check.check_structure` (pure Python, ``pread``, never
maps the file) before the file is opened, and remembers every file that passed
by its identity ``(st_dev, st_ino, st_size, st_mtime_ns)``:

* in this process (and its forked children, which inherit the memo);
* in pickled RecordFiles, which carry the identity they saw, so DataLoader
  workers (fork or spawn) do not check the file again;

unless the file changed since (another size or modification time, or another file
at the path): then it is checked again.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from torchrecord._store import opening as _opening
from torchrecord._store.lmdb_check import check_structure
from torchrecord.errors import ArgumentError, NotARecordSetError, RecordNotFoundError, StructureError

__all__ = [
    "CHECKS",
    "Check",
    "Identity",
    "checks_crc",
    "checks_structure",
    "combine_checks",
    "ensure",
    "identity",
    "parse_check",
]

#: The values of ``check=`` besides None (trust the file): each record's CRC-32 as it is read,
#: LMDB's page structure before the file is mapped, or both.
Check = Literal["checksums", "structure", "full"]
#: Every value of ``check=``.
CHECKS: tuple[str | None, ...] = (None, *get_args(Check))

#: (st_dev, st_ino, st_size, st_mtime_ns) of a file.
Identity = tuple[int, int, int, int]

#: identities of the files that passed the check in this process
_PASSED: set[Identity] = set()
_ATTEMPTS = 3


def parse_check(check: object) -> Check | None:
    """``check`` as given to a reader, checked: None, ``"checksums"``, ``"structure"`` or ``"full"``."""
    if check is None or (isinstance(check, str) and check in CHECKS):
        return check  # type: ignore[return-value]
    raise ArgumentError(
        f"check must be None, 'checksums', 'structure' or 'full', got {check!r}: 'checksums' checks each "
        "record's CRC-32 as it is read, 'structure' checks LMDB's page structure before reading a file of "
        "unknown provenance, 'full' does both"
    )


def checks_structure(check: str | None) -> bool:
    """Does ``check`` (parsed) include the structural check?"""
    return check in ("structure", "full")


def checks_crc(check: str | None) -> bool:
    """Does ``check`` (parsed) include each record's CRC-32?"""
    return check in ("checksums", "full")


def combine_checks(a: str | None, b: str | None) -> Check | None:
    """The check that does what ``a`` and ``b`` both ask for."""
    structure = checks_structure(a) or checks_structure(b)
    crc = checks_crc(a) or checks_crc(b)
    if structure and crc:
        return "full"
    return "structure" if structure else ("checksums" if crc else None)


def identity(path: str) -> Identity:
    """The identity of the file now at ``path`` (RecordNotFoundError if there is none)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def ensure(path: str, known: Identity | None = None) -> Identity:
    """Check the structure of the file at ``path`` unless it passed before; returns its identity.

    ``known``: the identity a pickled reader carries (it passed in the process that
    made the reader). Raises what :func:`check_structure` raises: StructureError for
    damage, NotARecordSetError / RecordNotFoundError for what is not a record set.
    """
    now = identity(path)
    if now == known or now in _PASSED:
        _PASSED.add(now)
        return now
    _opening.check_path(path)  # a directory, an empty file: say what it is
    for _ in range(_ATTEMPTS):
        try:
            check_structure(path)
        except NotARecordSetError:
            _opening.check_kind(path)  # an image, an .npy file...: say so
            raise
        after = identity(path)
        if after == now:  # the file did not change while it was checked
            _PASSED.add(now)
            return now
        now = after
    raise StructureError(f"{path}: the file keeps changing while its structure is checked; try again when it is not")
