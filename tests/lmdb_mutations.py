"""The structural mutation campaign: damage LMDB's page structure, then read with every path.

Three real record sets are written with ``write_record`` (variable-shape samples with
multi-page overflow values, fixed-shape samples on the fast path, chunked samples),
each with user metadata big enough to sit in overflow pages. Each campaign file is one
of them with one seeded structural mutation (see :data:`KINDS`). Every read path runs
on it in a forked child with an address-space limit and a timeout, and its outcome is
classified against the known samples:

* ``error``: a torchrecord error; ``correct``: the data read back exactly
  (``verify``: the report is ok; ``check``: the structural check passed);
* ``crash``: killed by a signal; ``hang``: past the timeout;
* ``wrong``: data came back without an error but differs from what was written
  (``verify``: ok while a data path read wrong data; ``check``: passed while a
  liblmdb path crashed, hung or read wrong data);
* ``other``: any other exception (its type is kept).

This module lives in ``tests/`` (imported as ``tests.lmdb_mutations`` by the tests and
by ``scripts/mutation_campaign.py``): it is test tooling, so it stays out of the
installed package, like ``tests/helpers.py``.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import struct
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import torchrecord
from torchrecord._check.isolate import run_each_in_child, run_in_child
from torchrecord._store.lmdb_check import PageInfo, check_structure, describe
from torchrecord._store.lmdb_format import F_BIGDATA, F_DUPDATA, F_SUBDATA, P_BRANCH, P_LEAF, P_OVERFLOW, PAGEHDRSZ
from torchrecord.errors import TorchRecordError, VariableShapeWarning

PATHS = ("check", "verify", "file", "dataset", "dataset_verify", "file_checked", "dataset_checked")
LIBLMDB_PATHS = ("verify", "file", "dataset", "dataset_verify", "file_checked", "dataset_checked")
DATA_PATHS = ("file", "dataset", "dataset_verify", "file_checked", "dataset_checked")
#: the paths that must never crash or hang: verify and the readers with check="structure"
SAFE_PATHS = ("check", "verify", "file_checked", "dataset_checked")
OUTCOMES = ("error", "correct", "crash", "hang", "wrong", "other")
BAD = ("crash", "hang", "wrong")

# -- the good record sets ---------------------------------------------------------------------------------------


def _mixed() -> list[Any]:
    """306 dict samples of varying shapes; six hold 10-36 KB arrays (multi-page overflow values)."""
    samples: list[Any] = []
    for i in range(306):
        n = 2500 + 1300 * (i - 300) if i >= 300 else (i * 7) % 41
        samples.append({"id": i, "x": np.arange(n, dtype=np.int32) + i, "tag": bytes([i % 251]) * (i % 5)})
    return samples


def _fixed() -> list[Any]:
    """400 (uint8[48], int) samples: one fixed layout, read on the fast path."""
    return [(torch.arange(48, dtype=torch.uint8) + (i % 200), i) for i in range(400)]


def _chunked() -> list[Any]:
    """600 (float32[6], int) samples, written 4 per record."""
    return [(torch.full((6,), float(i)), i) for i in range(600)]


#: name -> (samples, write_record keywords)
BASES: dict[str, tuple[Callable[[], list[Any]], dict[str, Any]]] = {
    "mixed": (_mixed, {"schema": {"x": [None]}}),
    "fixed": (_fixed, {"samples_per_record": 1}),  # one record per sample: many leaf and overflow pages
    "chunked": (_chunked, {"samples_per_record": 4}),
}
_USER_METADATA = {"notes": "n" * 6000}  # the metadata value spans overflow pages too


@dataclass
class Base:
    """A good record set: its bytes, its page map and the samples it holds in stored order."""

    name: str
    data: bytes
    pages: list[PageInfo]
    psize: int
    last: int
    expected: list[Any]
    canonical: list[Any] = field(default_factory=list)  # canonical(s) for each expected sample
    counts: Counter[Any] = field(default_factory=Counter)  # ... as a multiset

    def __post_init__(self) -> None:
        self.canonical = [canonical(s) for s in self.expected]
        self.counts = Counter(self.canonical)


def _write(samples: list[Any], path: str, kwargs: dict[str, Any]) -> None:
    with warnings.catch_warnings():  # the mixed set's shapes vary on purpose
        warnings.simplefilter("ignore", VariableShapeWarning)
        torchrecord.write_record(samples, path, shuffle=False, progress=False, metadata=_USER_METADATA, **kwargs)


def build_bases(directory: str) -> list[Base]:
    """Write the good record sets under ``directory`` (in a child, so this process opens no LMDB)."""
    bases = []
    for name, (make, kwargs) in BASES.items():
        samples = make()
        path = os.path.join(directory, f"base-{name}.tr")
        outcome = run_in_child(_write, samples, path, kwargs, timeout=120)
        assert outcome.status == "returned", outcome
        info = check_structure(path)
        with open(path, "rb") as f:
            data = f.read()
        bases.append(Base(name, data, describe(path), info.page_size, info.last_page, samples))
    return bases


# -- mutations --------------------------------------------------------------------------------------------------


class Skip(Exception):
    """This mutation does not apply to this base (nothing to mutate)."""


class Mutation:
    """One file's mutation: the bytes being damaged, the base's page map, a seeded generator."""

    def __init__(self, base: Base, rng: random.Random) -> None:
        self.base = base
        self.data = bytearray(base.data)
        self.rng = rng
        self.psize = base.psize

    # byte access (native order, like LMDB)
    def get(self, fmt: str, offset: int) -> int:
        return int(struct.unpack_from("=" + fmt, self.data, offset)[0])

    def put(self, fmt: str, offset: int, value: int) -> None:
        struct.pack_into("=" + fmt, self.data, offset, value & ((1 << (8 * struct.calcsize(fmt))) - 1))

    def at(self, pgno: int, offset: int = 0) -> int:
        return pgno * self.psize + offset

    def page_bytes(self, pgno: int) -> bytes:
        return bytes(self.data[self.at(pgno) : self.at(pgno + 1)])

    def set_page(self, pgno: int, content: bytes) -> None:
        self.data[self.at(pgno) : self.at(pgno + 1)] = content

    # choosing targets
    def pages(self, kind: str | None = None, database: str | None = None) -> list[PageInfo]:
        found = [
            p
            for p in self.base.pages
            if (kind is None or p.kind == kind) and (database is None or database in p.database)
        ]
        if not found:
            raise Skip(f"no {kind or ''} page in {database or 'any database'}")
        return found

    def tree_page(self, kind: str | None = None) -> PageInfo:
        """A branch or leaf page, mostly from the records and crc32 databases."""
        database = self.rng.choice(["records", "records", "records", "crc32", "crc32", "meta", "main", None])
        try:
            candidates = [p for p in self.pages(kind, database) if p.kind != "overflow"]
        except Skip:
            candidates = []
        if not candidates:
            candidates = [p for p in self.pages(kind) if p.kind != "overflow"]
        return self.rng.choice(candidates)

    def value(self, old: int, bits: int, extra: list[int]) -> int:
        """A new value for a field holding ``old``: extremes, small steps, random, or ``extra``."""
        top = (1 << bits) - 1
        choices = [0, top, old + 1, old - 1, old + 2, old - 2, old * 2, old // 2, self.rng.randrange(top + 1), *extra]
        while True:
            new = self.rng.choice(choices) & top
            if new != old:
                return new
            choices = [self.rng.randrange(top + 1), old ^ (1 << self.rng.randrange(bits))]


def _node_pointer(m: Mutation) -> str:
    page = m.tree_page()
    node = m.rng.choice(page.nodes)
    at = m.at(page.pgno, PAGEHDRSZ + 2 * node.index)
    old = m.get("H", at)
    upper = m.get("H", m.at(page.pgno, 14))
    new = m.value(old, 16, [m.psize - 2, m.psize - 8, upper - 2, upper, 0xFFFF, m.rng.randrange(upper, m.psize, 2)])
    m.put("H", at, new)
    return f"{page.database} {page.kind} page {page.pgno}: node {node.index} pointer {old} -> {new}"


def _misdirected_pointer(m: Mutation) -> str:
    page = m.tree_page()
    if len(page.nodes) < 2:
        raise Skip("one node")
    a, b = m.rng.sample(page.nodes, 2)
    at_a, at_b = m.at(page.pgno, PAGEHDRSZ + 2 * a.index), m.at(page.pgno, PAGEHDRSZ + 2 * b.index)
    if m.rng.random() < 0.6:  # node a now shows node b's key and data: b appears twice, a never
        m.put("H", at_a, m.get("H", at_b))
        return f"{page.database} {page.kind} page {page.pgno}: node {a.index} points at node {b.index}"
    pa, pb = m.get("H", at_a), m.get("H", at_b)
    m.put("H", at_a, pb)
    m.put("H", at_b, pa)
    return f"{page.database} {page.kind} page {page.pgno}: pointers of nodes {a.index} and {b.index} swapped"


def _node_size(m: Mutation) -> str:
    page = m.tree_page("leaf" if m.rng.random() < 0.8 else None)
    node = m.rng.choice(page.nodes)
    offset = m.at(page.pgno, node.offset)
    if page.kind == "leaf" and m.rng.random() < 0.7:
        old = m.get("H", offset) | m.get("H", offset + 2) << 16
        new = m.value(old, 32, [old + 4, old - 4, m.psize, 0xFFFFFFFF, 0xFFFF, old + 0x10000])
        m.put("H", offset, new & 0xFFFF)
        m.put("H", offset + 2, new >> 16)
        return f"{page.database} leaf page {page.pgno}: node {node.index} data size {old} -> {new}"
    old = m.get("H", offset + 6)
    new = m.value(old, 16, [0, 0xFFFF, 511, m.psize])
    m.put("H", offset + 6, new)
    return f"{page.database} {page.kind} page {page.pgno}: node {node.index} key size {old} -> {new}"


def _big_nodes(m: Mutation) -> list[tuple[PageInfo, Any]]:
    found = [(p, n) for p in m.pages("leaf") for n in p.nodes if n.flags & F_BIGDATA]
    if not found:
        raise Skip("no overflow value")
    return found


def _overflow_size(m: Mutation) -> str:
    page, node = m.rng.choice(_big_nodes(m))
    offset = m.at(page.pgno, node.offset)
    assert node.child is not None
    choice = m.rng.random()
    if choice < 0.4:  # the node's data size
        old = node.size
        new = m.value(old, 32, [0xFFFFFFFF, old + m.psize, old + 4 * m.psize, old - m.psize, old + 100, 1 << 24])
        m.put("H", offset, new & 0xFFFF)
        m.put("H", offset + 2, new >> 16)
        return f"{page.database} leaf page {page.pgno}: overflow node {node.index} data size {old} -> {new}"
    if choice < 0.75:  # the overflow run's page count
        at = m.at(node.child, 12)
        old = m.get("I", at)
        new = m.value(old, 32, [0, 1, 0xFFFFFFFF, m.base.last, m.base.last - node.child + 2])
        m.put("I", at, new)
        return f"overflow page {node.child} (of {page.database} page {page.pgno}): run of {old} pages -> {new}"
    at = offset + 8 + node.key_size  # the overflow page number in the node
    old = node.child
    others = [p.pgno for p in m.base.pages]
    new = m.value(old, 64, [m.rng.choice(others), m.base.last, m.base.last + 1, 1, old + 1, old - 1])
    m.put("Q", at, new)
    return f"{page.database} leaf page {page.pgno}: overflow node {node.index} page {old} -> {new}"


def _branch_child(m: Mutation) -> str:
    page = m.rng.choice(m.pages("branch"))
    if m.rng.random() < 0.25 and len(page.nodes) >= 2:  # swap two children
        a, b = m.rng.sample(page.nodes, 2)
        for node, child in ((a, b.child), (b, a.child)):
            assert child is not None
            offset = m.at(page.pgno, node.offset)
            m.put("H", offset, child & 0xFFFF)
            m.put("H", offset + 2, child >> 16 & 0xFFFF)
            m.put("H", offset + 4, child >> 32 & 0xFFFF)
        return f"{page.database} branch page {page.pgno}: children {a.index} and {b.index} swapped"
    node = m.rng.choice(page.nodes)
    assert node.child is not None
    old = node.child
    siblings = [n.child for n in page.nodes if n.child is not None and n.child != old]
    anywhere = [p.pgno for p in m.base.pages if p.pgno != old]
    new = m.value(
        old,
        48,
        [
            *siblings,
            *m.rng.sample(anywhere, min(3, len(anywhere))),
            page.pgno,
            0,
            1,
            m.base.last + 1,
            m.base.last,
            1 << 40,
        ],
    )
    offset = m.at(page.pgno, node.offset)
    m.put("H", offset, new & 0xFFFF)
    m.put("H", offset + 2, new >> 16 & 0xFFFF)
    m.put("H", offset + 4, new >> 32 & 0xFFFF)
    return f"{page.database} branch page {page.pgno}: child {node.index} page {old} -> {new}"


def _tree_pages(m: Mutation) -> list[PageInfo]:
    return [p for p in m.base.pages if p.kind != "overflow"]


def _patch_pgno(m: Mutation, pgno: int) -> None:
    """Give a copied page its new number back, so the header check alone cannot see the copy."""
    m.put("Q", m.at(pgno), pgno)


def _page_copy(m: Mutation) -> str:
    pages = _tree_pages(m)
    source, target = m.rng.sample(pages, 2)
    if m.rng.random() < 0.5:  # same database and kind: the likeliest silent damage
        same = [p for p in pages if p.kind == source.kind and p.database == source.database and p != source]
        target = m.rng.choice(same) if same else target
    m.set_page(target.pgno, m.page_bytes(source.pgno))
    patched = m.rng.random() < 0.5
    if patched:
        _patch_pgno(m, target.pgno)
    return (
        f"{source.database} {source.kind} page {source.pgno} copied over {target.database} {target.kind} "
        f"page {target.pgno}{' (page number patched)' if patched else ''}"
    )


def _page_swap(m: Mutation) -> str:
    pages = _tree_pages(m)
    a, b = m.rng.sample(pages, 2)
    if m.rng.random() < 0.5:
        same = [p for p in pages if p.kind == a.kind and p.database == a.database and p != a]
        b = m.rng.choice(same) if same else b
    content_a, content_b = m.page_bytes(a.pgno), m.page_bytes(b.pgno)
    m.set_page(a.pgno, content_b)
    m.set_page(b.pgno, content_a)
    patched = m.rng.random() < 0.5
    if patched:
        _patch_pgno(m, a.pgno)
        _patch_pgno(m, b.pgno)
    return f"pages {a.pgno} and {b.pgno} ({a.database} {a.kind}, {b.database} {b.kind}) swapped" + (
        " (page numbers patched)" if patched else ""
    )


def _duplicate_leaf(m: Mutation) -> str:
    leaves = [p for p in m.pages("leaf") if "records" in p.database or "crc32" in p.database]
    by_db: dict[str, list[PageInfo]] = {}
    for p in leaves:
        by_db.setdefault(p.database, []).append(p)
    runs = [ps for ps in by_db.values() if len(ps) >= 2]
    if not runs:
        raise Skip("no database with two leaf pages")
    run = m.rng.choice(runs)
    i = m.rng.randrange(len(run) - 1)
    source, target = (run[i], run[i + 1]) if m.rng.random() < 0.5 else (run[i + 1], run[i])
    if m.rng.random() < 0.3:
        target = m.rng.choice([p for p in run if p != source])
    m.set_page(target.pgno, m.page_bytes(source.pgno))
    _patch_pgno(m, target.pgno)
    return f"{source.database} leaf page {source.pgno} duplicated over leaf page {target.pgno} (page number patched)"


def _page_header(m: Mutation) -> str:
    page = m.rng.choice(m.base.pages)
    field_name = m.rng.choice(
        ["flags", "flags", "lower", "upper", "pgno", "pad"]
        if page.kind != "overflow"
        else ["flags", "flags", "pgno", "pad"]
    )
    offset, fmt = {"pgno": (0, "Q"), "pad": (8, "H"), "flags": (10, "H"), "lower": (12, "H"), "upper": (14, "H")}[
        field_name
    ]
    at = m.at(page.pgno, offset)
    old = m.get(fmt, at)
    if field_name == "flags":
        extra = [
            P_BRANCH,
            P_LEAF,
            P_OVERFLOW,
            0x08,
            old | 0x10,
            old | 0x20,
            old | 0x40,
            old | 0x8000,
            P_LEAF | 0x20,
            P_BRANCH | P_LEAF,
        ]
    elif field_name == "pgno":
        extra = [m.base.last, page.pgno + 1, page.pgno - 1]
    else:
        extra = [m.psize, PAGEHDRSZ, old + 2, old - 2, old + 1, m.psize + 2]
    new = m.value(old, 8 * struct.calcsize(fmt), extra)
    m.put(fmt, at, new)
    return f"{page.database} {page.kind} page {page.pgno}: header {field_name} {old} -> {new}"


#: field -> (offset in the meta page, struct format)
_META_FIELDS = {
    "page flags": (10, "H"),
    "magic": (16, "I"),
    "version": (20, "I"),
    "mapsize": (32, "Q"),
    "page size": (40, "I"),
    "free flags": (44, "H"),
    "free depth": (46, "H"),
    "free entries": (40 + 32, "Q"),
    "free root": (40 + 40, "Q"),
    "main flags": (88 + 4, "H"),
    "main depth": (88 + 6, "H"),
    "main branch pages": (88 + 8, "Q"),
    "main leaf pages": (88 + 16, "Q"),
    "main entries": (88 + 32, "Q"),
    "main root": (88 + 40, "Q"),
    "last page": (136, "Q"),
    "txnid": (144, "Q"),
}


def _meta_field(m: Mutation) -> str:
    txnids = [m.get("Q", m.at(n, 144)) for n in (0, 1)]
    current = 1 if txnids[0] < txnids[1] else 0
    number = current if m.rng.random() < 0.7 else 1 - current
    name = m.rng.choice(list(_META_FIELDS))
    offset, fmt = _META_FIELDS[name]
    at = m.at(number, offset)
    old = m.get(fmt, at)
    tree = [p.pgno for p in m.base.pages]
    extra = {
        "txnid": [txnids[1 - number] + 1, txnids[1 - number]],
        "page size": [512, 1024, 8192, 65536],
        "last page": [m.base.last - 1, m.base.last + 1, 1, 2],
        "main root": [*m.rng.sample(tree, 2), 0, 1],
        "free root": [*m.rng.sample(tree, 2), 0, 1],
    }.get(name, [])
    new = m.value(old, 8 * struct.calcsize(fmt), extra)
    m.put(fmt, at, new)
    which = "current" if number == current else "older"
    return f"meta page {number} ({which}): {name} {old} -> {new}"


def _named_db_record(m: Mutation) -> str:
    main = [p for p in m.pages("leaf", "main")]
    page = m.rng.choice(main)
    node = m.rng.choice(page.nodes)
    offset = m.at(page.pgno, node.offset)
    if m.rng.random() < 0.2:
        old = m.get("H", offset + 4)
        new = m.value(old, 16, [0, F_BIGDATA, F_SUBDATA | F_DUPDATA, F_SUBDATA | F_BIGDATA, F_DUPDATA])
        m.put("H", offset + 4, new)
        return f"main database page {page.pgno}: named database node {node.index} flags {old} -> {new}"
    record = offset + 8 + node.key_size
    name, rel, fmt = m.rng.choice(
        [
            ("flags", 4, "H"),
            ("depth", 6, "H"),
            ("branch pages", 8, "Q"),
            ("leaf pages", 16, "Q"),
            ("overflow pages", 24, "Q"),
            ("entries", 32, "Q"),
            ("root", 40, "Q"),
            ("root", 40, "Q"),
            ("pad", 0, "I"),
        ]
    )
    old = m.get(fmt, record + rel)
    tree = [p.pgno for p in m.base.pages]
    extra = [*m.rng.sample(tree, 3), 0, 1, (1 << 64) - 1] if name == "root" else [4, 8, 0x10]
    new = m.value(old, 8 * struct.calcsize(fmt), extra)
    m.put(fmt, record + rel, new)
    database = m.base.data[offset + 8 : offset + 8 + node.key_size].decode(errors="replace")
    return f"main database page {page.pgno}: database {database!r} record {name} {old} -> {new}"


def _key_bytes(m: Mutation) -> str:
    page = m.tree_page()
    nodes = [n for n in page.nodes if n.key_size and not (page.kind == "branch" and n.index == 0)]
    if not nodes:
        raise Skip("no key")
    node = m.rng.choice(nodes)
    at = m.at(page.pgno, node.offset + 8 + m.rng.randrange(node.key_size))
    old = m.data[at]
    new = m.rng.choice([old ^ (1 << m.rng.randrange(8)), 0, 0xFF, (old + 1) & 0xFF])
    if new == old:
        new = old ^ 1
    m.data[at] = new
    return f"{page.database} {page.kind} page {page.pgno}: node {node.index} key byte {old} -> {new}"


def _node_flags(m: Mutation) -> str:
    page = m.tree_page("leaf")
    node = m.rng.choice(page.nodes)
    at = m.at(page.pgno, node.offset + 4)
    old = m.get("H", at)
    new = m.value(old, 16, [old ^ F_BIGDATA, old | F_DUPDATA, old | F_SUBDATA, old ^ F_SUBDATA, 0x8])
    m.put("H", at, new)
    return f"{page.database} leaf page {page.pgno}: node {node.index} flags {old} -> {new}"


def _zero_page(m: Mutation) -> str:
    page = m.rng.choice(m.base.pages)
    m.set_page(page.pgno, bytes(m.psize))
    return f"{page.database} {page.kind} page {page.pgno} zeroed"


def _truncate(m: Mutation) -> str:
    size = len(m.data)
    new = m.rng.choice(
        [
            m.rng.randrange(m.psize * 2, size),
            m.psize * m.rng.randrange(2, size // m.psize),
            size - m.psize,
            size - 1,
            m.psize + 100,
        ]
    )
    del m.data[new:]
    return f"truncated from {size} to {new} bytes"


#: mutation kind -> function applying it (returns a description)
KINDS: dict[str, Callable[[Mutation], str]] = {
    "node_pointer": _node_pointer,
    "misdirected_pointer": _misdirected_pointer,
    "node_size": _node_size,
    "overflow_size": _overflow_size,
    "branch_child": _branch_child,
    "page_copy": _page_copy,
    "page_swap": _page_swap,
    "duplicate_leaf": _duplicate_leaf,
    "page_header": _page_header,
    "meta_field": _meta_field,
    "named_db_record": _named_db_record,
    "key_bytes": _key_bytes,
    "node_flags": _node_flags,
    "zero_page": _zero_page,
    "truncate": _truncate,
}


def mutate(base: Base, kind: str, seed: int) -> tuple[bytes, str]:
    """``base``'s bytes with one seeded mutation of ``kind``, and what was done."""
    rng = random.Random(f"{seed}:{kind}:{base.name}")
    for _ in range(100):
        m = Mutation(base, rng)
        try:
            description = KINDS[kind](m)
        except Skip:
            continue
        if bytes(m.data) != base.data:
            return bytes(m.data), description
    raise Skip(f"{kind} does not apply to the {base.name} set")


# -- the read paths (each runs in a forked child) -------------------------------------------------------------


def canonical(sample: Any) -> Any:
    """A hashable, exact form of a sample (dtype, shape and bytes of every array)."""
    if isinstance(sample, torch.Tensor):
        return (
            "tensor",
            str(sample.dtype),
            tuple(sample.shape),
            sample.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if sample.numel() else b"",
        )
    if isinstance(sample, np.ndarray):
        return ("ndarray", str(sample.dtype), sample.shape, np.ascontiguousarray(sample).tobytes())
    if isinstance(sample, dict):
        return ("dict", tuple((k, canonical(v)) for k, v in sample.items()))
    if isinstance(sample, list | tuple):
        return (type(sample).__name__, tuple(canonical(v) for v in sample))
    return (type(sample).__name__, sample)


def _read_path(path_name: str, file: str, base: Base) -> list[str]:
    """Run one read path; returns [outcome, detail] (the child's msgpack-able result)."""
    try:
        if path_name == "check":
            check_structure(file)
            return ["correct", ""]
        if path_name == "verify":
            report = torchrecord.verify(file, progress=False)
            return ["correct", ""] if report.ok else ["error", str(report.first_error)[:300]]
        check = "structure" if path_name.endswith("_checked") else None
        if path_name.startswith("file"):
            got = [canonical(s) for s in torchrecord.RecordFile(file, check=check)]
            if got == base.canonical:
                return ["correct", ""]
        else:
            if path_name == "dataset_verify":
                check = "full" if check == "structure" else "checksums"
            ds = torchrecord.RecordDataset(file, shuffle=False, check=check)
            got = [canonical(s) for s in ds]
            if Counter(got) == base.counts:
                return ["correct", ""]
        return ["wrong", _difference(got, base.canonical)]
    except TorchRecordError as exc:
        return ["error", f"{type(exc).__name__}: {str(exc)[:300]}"]
    except Exception as exc:
        return ["other", f"{type(exc).__name__}: {str(exc)[:300]}"]


def _difference(got: list[Any], want: list[Any]) -> str:
    extra = Counter(got) - Counter(want)
    missing = Counter(want) - Counter(got)
    return (
        f"{len(got)} samples read, {len(want)} written; {sum(extra.values())} unexpected, "
        f"{sum(missing.values())} missing"
    )


# -- the campaign ---------------------------------------------------------------------------------------------


@dataclass
class FileResult:
    """One mutated file: what was done to it and what each read path did."""

    index: int
    base: str
    kind: str
    description: str
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (outcome, detail)

    @property
    def liblmdb_bad(self) -> bool:
        """A liblmdb read path crashed, hung or read wrong data."""
        return any(self.outcomes[p][0] in BAD for p in LIBLMDB_PATHS if p in self.outcomes)

    @property
    def missed(self) -> bool:
        """The structural check passed a file on which a liblmdb read path crashed, hung or read wrong data."""
        return self.liblmdb_bad and self.outcomes.get("check", ("", ""))[0] != "error"


@dataclass
class Campaign:
    """All results, with the tables."""

    files: list[FileResult]
    seconds: float

    def table(self, path: str) -> dict[str, Counter[str]]:
        rows: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
        for f in self.files:
            if path in f.outcomes:
                rows[f.kind][f.outcomes[path][0]] += 1
        return rows

    def totals(self, path: str) -> Counter[str]:
        return Counter(f.outcomes[path][0] for f in self.files if path in f.outcomes)

    def missed(self) -> list[FileResult]:
        return [f for f in self.files if f.missed]

    def failures(self) -> dict[str, int]:
        """What the campaign must not see: crashes and hangs in the safe paths (verify, the structural
        check, the readers with check="structure"); wrong data and exceptions other than torchrecord's
        in any path (a plain reader may crash on a damaged file, but not raise a foreign exception)."""
        safe = Counter(f.outcomes[p][0] for f in self.files for p in SAFE_PATHS if p in f.outcomes)
        anywhere = Counter(f.outcomes[p][0] for f in self.files for p in PATHS if p in f.outcomes)
        return {
            "crash": safe["crash"],
            "hang": safe["hang"],
            "other": anywhere["other"],
            "wrong": anywhere["wrong"],
            "missed": len(self.missed()),
        }

    def render(self) -> str:
        lines = [f"{len(self.files)} mutated files, {self.seconds:.0f} s"]
        for path in PATHS:
            lines.append("")
            lines.append(f"read path: {path}")
            lines.append(f"{'mutation':<22}" + "".join(f"{o:>8}" for o in OUTCOMES))
            for kind, row in self.table(path).items():
                lines.append(f"{kind:<22}" + "".join(f"{row[o]:>8}" for o in OUTCOMES))
            total = self.totals(path)
            lines.append(f"{'total':<22}" + "".join(f"{total[o]:>8}" for o in OUTCOMES))
        bad = [f for f in self.files if f.liblmdb_bad]
        lines.append("")
        lines.append(
            f"files where a liblmdb path crashed, hung or read wrong data: {len(bad)}; "
            f"flagged by check_structure: {sum(not f.missed for f in bad)}; missed: {len(self.missed())}"
        )
        for f in self.missed()[:20]:
            lines.append(f"  MISSED #{f.index} {f.base} {f.kind}: {f.description} -> {f.outcomes}")
        failures = self.failures()
        lines.append(
            f"{', '.join(SAFE_PATHS)}: {failures['crash']} crashes, {failures['hang']} hangs; in any read "
            f"path: {failures['other']} other exceptions, {failures['wrong']} wrong data"
        )
        for f in self.files:
            bad = {
                p: o
                for p, o in f.outcomes.items()
                if o[0] == "wrong" or (p in SAFE_PATHS and o[0] in ("crash", "hang", "other"))
            }
            if bad:
                lines.append(f"  FAILED #{f.index} {f.base} {f.kind}: {f.description} -> {bad}")
        return "\n".join(lines)


def plan(files: int, bases: list[Base]) -> Iterator[tuple[int, Base, str]]:
    """File i: base i mod 3, kind cycling through KINDS (every kind on every base)."""
    kinds = list(KINDS)
    for i in range(files):
        yield i, bases[i % len(bases)], kinds[(i // len(bases)) % len(kinds)]


def mutants(files: int, bases: list[Base], seed: int = 0) -> Iterator[tuple[int, Base, str, bytes | None, str]]:
    """(index, base, kind, mutated bytes or None if the kind does not apply, description) per file."""
    for index, base, kind in plan(files, bases):
        try:
            data, description = mutate(base, kind, seed * 1_000_003 + index)
        except Skip as exc:
            yield index, base, kind, None, f"skipped: {exc}"
            continue
        yield index, base, kind, data, description


def run_campaign(
    files: int,
    directory: str,
    *,
    seed: int = 0,
    paths: tuple[str, ...] = PATHS,
    timeout: float = 20.0,
    memory_limit: int = 2 << 30,
    progress: Callable[[FileResult], None] | None = None,
    keep: bool = False,
) -> Campaign:
    """Write the bases, then ``files`` mutated files, each read by every path in a forked child."""
    start = time.monotonic()
    os.makedirs(directory, exist_ok=True)
    bases = build_bases(directory)
    results = []
    for index, base, kind, data, description in mutants(files, bases, seed):
        if data is None:
            results.append(FileResult(index, base.name, kind, description))
            continue
        file = os.path.join(directory, f"mutant-{index:05d}.tr")
        with open(file, "wb") as f:
            f.write(data)
        result = FileResult(index, base.name, kind, description)
        # all paths in one child while it lives; a crash or hang costs a fresh child for the rest
        outcomes = run_each_in_child(
            functools.partial(_read_path, file=file, base=base), paths, timeout=timeout, memory_limit=memory_limit
        )
        for path_name, outcome in zip(paths, outcomes):
            if outcome.status == "returned":
                result.outcomes[path_name] = (str(outcome.value[0]), str(outcome.value[1]))
            elif outcome.status == "signal":
                result.outcomes[path_name] = ("crash", f"{outcome.signal_name} {outcome.stderr.strip()[-200:]}")
            elif outcome.status == "timeout":
                result.outcomes[path_name] = ("hang", f"no result in {timeout} s")
            else:
                result.outcomes[path_name] = ("other", f"{outcome.status} {outcome.error_type} {outcome.message}")
        _cross_check(result)
        results.append(result)
        if progress is not None:
            progress(result)
        if not keep:
            os.remove(file)
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return Campaign(results, time.monotonic() - start)


def _cross_check(result: FileResult) -> None:
    """``verify`` ok while a data path read wrong data, or the check passing a file a liblmdb path
    crashed, hung or misread on, are wrong verdicts."""
    outcomes = result.outcomes
    if outcomes.get("verify", ("", ""))[0] == "correct" and any(
        outcomes[p][0] == "wrong" for p in DATA_PATHS if p in outcomes
    ):
        outcomes["verify"] = ("wrong", "verify passed a file a data path misread")
    if outcomes.get("check", ("", ""))[0] == "correct" and result.liblmdb_bad:
        outcomes["check"] = ("wrong", "the structural check passed a file a liblmdb path crashed, hung or misread on")
