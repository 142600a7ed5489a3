"""The identity of a record set: a random ``set_id`` written with it.

Later features use it to recognize a set (for example to refuse a saved reader
state taken on another set). Files written before ``set_id`` existed get a
stable stand-in derived from their raw metadata bytes.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

__all__ = ["LEGACY_PREFIX", "new_set_id", "set_id_of"]

#: Prefix of the stand-in identity of a set written without ``set_id``.
LEGACY_PREFIX = "legacy-"


def new_set_id() -> str:
    """A fresh random identity: uuid4 as 32 hex digits."""
    return uuid.uuid4().hex


def set_id_of(meta: dict[str, Any], raw_metadata: bytes) -> str:
    """The set's ``set_id``, or ``"legacy-"`` + the first 32 hex digits of SHA-256(raw metadata)."""
    set_id = meta.get("set_id")
    if isinstance(set_id, str) and set_id:
        return set_id
    return LEGACY_PREFIX + hashlib.sha256(raw_metadata).hexdigest()[:32]
