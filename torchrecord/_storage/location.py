"""Where the shard cache is, and how much it keeps: the folder and the limit, from arguments or the environment.

The cache folder is ``cache_dir`` if given, else ``$TORCHRECORD_CACHE``, else
``$XDG_CACHE_HOME/torchrecord``, else ``~/.cache/torchrecord``. It keeps at most ``cache_limit``
bytes (else ``$TORCHRECORD_CACHE_LIMIT``, else ``DEFAULT_CACHE_LIMIT``).
"""

from __future__ import annotations

import os

from torchrecord.errors import ArgumentError

__all__ = [
    "CACHE_ENV",
    "DEFAULT_CACHE_LIMIT",
    "LIMIT_ENV",
    "cache_location",
    "default_limit",
    "describe_limit",
    "env_number",
]

#: Bytes of shards the cache keeps when ``cache_limit`` is None (env TORCHRECORD_CACHE_LIMIT): 20 GiB.
DEFAULT_CACHE_LIMIT = 20 << 30
#: The environment variable naming the cache folder used when ``cache_dir`` is None.
CACHE_ENV = "TORCHRECORD_CACHE"
LIMIT_ENV = "TORCHRECORD_CACHE_LIMIT"


def cache_location(cache_dir: str | os.PathLike[str] | None) -> tuple[str, bool]:
    """(the cache folder, whether it is the implicit default) for a reader's ``cache_dir``.

    ``cache_dir`` if given, else ``$TORCHRECORD_CACHE``, else ``$XDG_CACHE_HOME/torchrecord``
    (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says), else ``~/.cache/torchrecord``.
    """
    if cache_dir is not None and os.fspath(cache_dir) != "":
        return os.path.abspath(os.path.expanduser(os.fsdecode(cache_dir))), False
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen)), False
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchrecord"), True


def env_number(name: str, default: float, *, integer: bool = False, none_ok: bool = False) -> float | None:
    """The number in environment variable ``name`` (``default`` if unset; ArgumentError naming it if bad)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if none_ok and text.lower() in ("none", "unlimited"):
        return None
    try:
        value: float = int(text) if integer else float(text)
    except ValueError:
        value = -1
    if not value >= 0:  # NaN too
        kind = "a whole number of bytes" if integer else "a number"
        raise ArgumentError(f"${name}={text!r}: must be {kind} >= 0{' or none' if none_ok else ''}")
    return value


def default_limit() -> int | None:
    """The cache limit when the reader gives none: ``$TORCHRECORD_CACHE_LIMIT`` or DEFAULT_CACHE_LIMIT."""
    limit = env_number(LIMIT_ENV, DEFAULT_CACHE_LIMIT, integer=True, none_ok=True)
    return None if limit is None else int(limit)


def describe_limit(limit: int | None) -> str:
    """A cache limit in words, for messages."""
    if limit is None:
        return "no limit"
    return f"{limit / (1 << 30):.3g} GiB" if limit >= 1 << 30 else f"{limit} bytes"
