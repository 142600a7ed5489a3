"""Helpers for the tests of files of unknown provenance: damage a real record set's LMDB
structure or rewrite its metadata, and run a read in a forked child that reports how it ended."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import torch

import torchrecord
from torchrecord._check.isolate import ChildOutcome, run_in_child
from torchrecord._store import format as _format
from torchrecord._store.lmdb_check import check_structure, describe
from torchrecord._store.lmdb_format import PAGEHDRSZ
from torchrecord.errors import TorchRecordError


def write_set(path: Path, n: int = 600, size: int = 48, **kwargs: Any) -> str:
    """n samples of (uint8[size] holding i % 251, i), in order, with checksums."""
    kwargs.setdefault("shuffle", False)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("samples_per_record", 1)  # record i holds sample i: the tests damage records by index
    samples = [(torch.full((size,), i % 251, dtype=torch.uint8), i) for i in range(n)]
    torchrecord.write_record(samples, path, **kwargs)
    return str(path)


def leaf_pages(path: str, database: str) -> list[Any]:
    """The leaf pages of one database (``"records"``, ``"crc32"``, ``"meta"``), from the structural walk."""
    return [p for p in describe(path) if p.kind == "leaf" and database in p.database]


def set_node_pointer(path: str, database: str, value: int = 0xFFFF, page: int = 0, node: int = 0) -> int:
    """Point node ``node`` of leaf page ``page`` of ``database`` at ``value``; returns the page number."""
    target = leaf_pages(path, database)[page]
    psize = check_structure(path).page_size
    with open(path, "r+b") as f:
        f.seek(target.pgno * psize + PAGEHDRSZ + 2 * node)
        f.write(struct.pack("=H", value))
    return int(target.pgno)


def set_node_size(path: str, database: str, value: int = 0xFFFFFFFF, page: int = 0) -> int:
    """Give the first overflow node of leaf page ``page`` of ``database`` the data size ``value``."""
    target = [p for p in leaf_pages(path, database) if any(n.flags & 1 for n in p.nodes)][page]
    node = next(n for n in target.nodes if n.flags & 1)
    psize = check_structure(path).page_size
    with open(path, "r+b") as f:
        f.seek(target.pgno * psize + node.offset)
        f.write(struct.pack("=HH", value & 0xFFFF, value >> 16))
    return int(target.pgno)


def raw_meta(path: str) -> dict[str, Any]:
    env = lmdb.open(path, subdir=False, lock=False, readonly=True, max_dbs=_format.MAX_DBS)
    try:
        db = env.open_db(_format.META_DB, create=False)
        with env.begin() as txn:
            raw = txn.get(_format.META_KEY, db=db)
        return dict(msgpack.unpackb(raw, raw=False))
    finally:
        env.close()


def put_meta_bytes(path: str, raw: bytes) -> None:
    """Replace the metadata record with ``raw`` (raw LMDB; before torchrecord opens the file here)."""
    env = lmdb.open(path, subdir=False, lock=False, max_dbs=_format.MAX_DBS, map_size=1 << 30)
    try:
        db = env.open_db(_format.META_DB)
        with env.begin(write=True) as txn:
            txn.put(_format.META_KEY, raw, db=db)
    finally:
        env.close()


def set_meta(path: str, **changes: Any) -> None:
    """Rewrite metadata fields (e.g. count=10**12)."""
    meta = raw_meta(path)
    meta.update(changes)
    put_meta_bytes(path, msgpack.packb(meta, use_bin_type=True))


def set_field(path: str, index: int, **changes: Any) -> None:
    """Rewrite schema field ``index`` (e.g. shape=[2**15, 2**15])."""
    meta = raw_meta(path)
    meta["schema"]["fields"][index].update(changes)
    put_meta_bytes(path, msgpack.packb(meta, use_bin_type=True))


def keep_identity(path: str, change: Any) -> None:
    """Change the file in place with ``change(path)``, keeping its size and modification time."""
    st = os.stat(path)
    change(path)
    assert os.path.getsize(path) == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def outcome(fn: Any, *args: Any, memory_limit: int | None = None, timeout: float = 120) -> ChildOutcome:
    """How ``fn(*args)`` ended in a forked child (a value, an exception, a signal, a timeout)."""
    return run_in_child(fn, *args, timeout=timeout, memory_limit=memory_limit)


def error_or_value(fn: Any, *args: Any) -> list[Any]:
    """``["ok", fn(*args)]`` or ``[error class name, message]`` for a torchrecord error (for children)."""
    try:
        return ["ok", fn(*args)]
    except TorchRecordError as exc:
        return [type(exc).__name__, str(exc)]


def labels(batches: Any) -> list[int]:
    """The labels of samples or batches of (image, label), flattened."""
    out: list[int] = []
    for item in batches:
        label = item[1]
        out.extend(np.asarray(label).reshape(-1).tolist())
    return out
