"""The pure-Python structural check of LMDB files (torchrecord/_store/lmdb_check.py and the modules it builds on).

* Good files of every shape pass: empty set, one record, many pages and a deep
  tree, overflow values, chunked records, no checksums, and a raw LMDB file after
  random inserts, overwrites and deletes.
* Every mutation kind of the campaign fails with a StructureError naming the file,
  the page and the damage; a few hand-made ones with the exact reason.
* Never crashes, hangs or over-allocates: the mutation campaign reads each mutated
  file with the check and with every liblmdb read path in forked children; the
  check crashes and hangs on none, and flags every file on which a liblmdb path
  crashed, hung or read wrong data (about 100 files by default, 2,000 with --runslow).
* The vectorized leaf check agrees with the scalar reference on every mutated file.
"""

from __future__ import annotations

import os
import random
import struct
import warnings
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from tests.lmdb_mutations import KINDS, Base, Mutation, build_bases, mutants, run_campaign
from torchrecord._check.isolate import run_in_child
from torchrecord._store import lmdb_check as _lmdb_check
from torchrecord._store.lmdb_check import PageInfo, StructureInfo, check_structure
from torchrecord._store.lmdb_format import PAGEHDRSZ
from torchrecord.errors import NotARecordSetError, RecordNotFoundError, StructureError


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[Base]:
    return build_bases(str(tmp_path_factory.mktemp("bases")))


def _write(tmp_path: Path, samples: object, **kwargs: object) -> str:
    path = str(tmp_path / "set.tr")
    outcome = run_in_child(_write_set, samples, path, kwargs, timeout=300)  # this process opens no LMDB
    assert outcome.status == "returned", outcome
    return path


def _write_set(samples: object, path: str, kwargs: dict[str, object]) -> None:
    kwargs.setdefault("samples_per_record", 1)  # the page structures these tests need
    with warnings.catch_warnings():  # the empty set's "no samples" warning: wanted here
        warnings.filterwarnings("ignore", ".*the source has no samples", torchrecord.TorchRecordWarning)
        torchrecord.write_record(samples, path, progress=False, **kwargs)


def _both(path: str) -> StructureInfo:
    """The check with the vectorized leaf path and with the scalar one: same verdict."""
    info = check_structure(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        scalar = _lmdb_check._Walker(path, fd, os.fstat(fd).st_size, None, vector=False).run()
    finally:
        os.close(fd)
    assert scalar == info
    return info


# -- good files --------------------------------------------------------------------------------------------------


def test_an_empty_set_passes(tmp_path: Path) -> None:
    info = _both(_write(tmp_path, []))
    assert info.databases[b"records"].entries == 0 and info.databases[b"records"].root is None
    assert set(info.databases) == {b"records", b"crc32", b"meta"}


def test_one_record_passes(tmp_path: Path) -> None:
    info = _both(_write(tmp_path, [torch.zeros(3)]))
    assert info.databases[b"records"].entries == 1 and info.databases[b"records"].depth == 1


def test_many_pages_pass(tmp_path: Path) -> None:
    info = _both(_write(tmp_path, [(np.arange(20, dtype=np.int16) + i, i) for i in range(30_000)]))
    records = info.databases[b"records"]
    assert records.entries == 30_000 and records.depth == 3 and records.leaf_pages > 500


def test_overflow_values_pass(tmp_path: Path) -> None:
    samples = [np.arange(n, dtype=np.int32) for n in (1, 600, 1200, 5000, 20_000, 3)]
    info = _both(_write(tmp_path, samples, metadata={"big": "m" * 10_000}, schema={"value": [None]}))
    assert info.databases[b"records"].overflow_pages >= 1 + 2 + 5 + 20
    assert info.databases[b"meta"].overflow_pages >= 3


def test_chunked_records_pass(tmp_path: Path) -> None:
    info = _both(_write(tmp_path, [torch.full((5,), i) for i in range(1001)], samples_per_record=4))
    assert info.databases[b"records"].entries == 251


def test_a_set_without_checksums_and_many_commits_passes(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [np.full(300, i % 251, np.uint8) for i in range(2000)],
        checksums=False,
        commit_bytes=4096,
        initial_map_size=1 << 16,
    )
    info = _both(path)
    assert info.databases[b"crc32"].entries == 0 and info.databases[b"records"].entries == 2000


def test_a_raw_lmdb_file_after_inserts_overwrites_and_deletes_passes(tmp_path: Path) -> None:
    """LMDB's own invariants, not just the append-only layout write_record makes."""
    path = str(tmp_path / "raw.mdb")
    rng = random.Random(7)

    def build() -> None:
        env = lmdb.open(path, subdir=False, max_dbs=4, map_size=1 << 28, lock=False)
        dbs = [env.open_db(name) for name in (b"records", b"crc32", b"meta")]
        keys: list[tuple[int, bytes]] = []
        for _ in range(12):
            with env.begin(write=True) as txn:
                for _ in range(300):
                    if keys and rng.random() < 0.3:
                        which, key = keys.pop(rng.randrange(len(keys)))
                        txn.delete(key, db=dbs[which])
                    else:
                        which, key = rng.randrange(3), rng.randbytes(rng.randint(1, 40))
                        value = rng.randbytes(rng.choice([0, 7, 300, 2100, 9000]))
                        txn.put(key, value, db=dbs[which])
                        keys.append((which, key))
        env.close()

    assert run_in_child(build, timeout=120).status == "returned"
    info = _both(path)
    assert sum(db.entries for db in info.databases.values()) > 500


def test_describe_lists_every_page_once(bases: list[Base]) -> None:
    for base in bases:
        pages: list[PageInfo] = base.pages
        covered = [p.pgno + i for p in pages for i in range(p.pages)]
        assert len(covered) == len(set(covered))
        assert {p.kind for p in pages} == {"branch", "leaf", "overflow"}
        assert max(covered) <= base.last


# -- damaged files -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_mutation_kind_has_an_example_that_fails_clearly(kind: str, bases: list[Base], tmp_path: Path) -> None:
    """The first seeded mutation of this kind that the check flags: file, page and reason named."""
    path = str(tmp_path / f"{kind}.tr")
    for _index, _base, each, data, _description in mutants(len(KINDS) * 3 * 6, bases):
        if each != kind or data is None:
            continue
        Path(path).write_bytes(data)
        try:
            check_structure(path)
        except StructureError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: damaged LMDB structure at ")
            assert "page" in message and StructureError.HINT in message
            return
        except NotARecordSetError as exc:  # page 0 without LMDB's magic, or less than two pages: not LMDB at all
            assert kind in ("meta_field", "truncate") and str(exc).startswith(path)
    pytest.fail(f"no {kind} mutation among the first files was flagged")


def _damaged(base: Base, tmp_path: Path, change: object) -> str:
    m = Mutation(base, random.Random(0))
    change(m)  # type: ignore[operator]
    path = str(tmp_path / "damaged.tr")
    Path(path).write_bytes(bytes(m.data))
    return path


def _raises(path: str, *fragments: str) -> str:
    with pytest.raises(StructureError) as info:
        check_structure(path)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def _leaf(base: Base, database: str = "records", index: int = 0) -> PageInfo:
    return [p for p in base.pages if p.kind == "leaf" and database in p.database][index]


def test_node_pointer_outside_the_page(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[1])
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(leaf.pgno, PAGEHDRSZ + 2), 0xFFFF))
    _raises(path, f"page {leaf.pgno} (leaf page of the database 'records'", "node 1's pointer 65535 is outside")


def test_misdirected_node_pointer(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[1])
    path = _damaged(
        bases[1],
        tmp_path,
        lambda m: m.put("H", m.at(leaf.pgno, PAGEHDRSZ + 2), m.get("H", m.at(leaf.pgno, PAGEHDRSZ + 4))),
    )
    _raises(path, f"page {leaf.pgno}", "overlaps the node before it")


def test_node_size_past_the_page(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[1])
    node = leaf.nodes[3]
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(leaf.pgno, node.offset + 2), 0xFFFF))
    _raises(path, f"page {leaf.pgno}", "node 3 at offset", "past the page's 4096")


def test_overflow_size_and_run(bases: list[Base], tmp_path: Path) -> None:
    leaf, node = next(
        (p, n) for p in bases[0].pages if p.kind == "leaf" and "records" in p.database for n in p.nodes if n.child
    )
    assert node.child is not None
    path = _damaged(
        bases[0],
        tmp_path,
        lambda m: (
            m.put("H", m.at(leaf.pgno, node.offset), 0xFFFF),
            m.put("H", m.at(leaf.pgno, node.offset + 2), 0xFFFF),
        ),
    )
    _raises(path, f"page {node.child} (overflow page for leaf page", "cannot hold the node's 4294967295 bytes")
    path = _damaged(bases[0], tmp_path, lambda m: m.put("I", m.at(node.child, 12), 0xFFFFFFFF))
    _raises(path, f"page {node.child}", "ends past the last page in use")


def test_branch_child_pointing_at_a_meta_page_or_a_sibling(bases: list[Base], tmp_path: Path) -> None:
    branch = next(p for p in bases[1].pages if p.kind == "branch" and "records" in p.database)
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(branch.pgno, branch.nodes[2].offset), 1))
    _raises(path, f"page {branch.pgno} (branch page", "child 2 is page 1, outside the data pages")
    sibling = branch.nodes[1].child
    assert sibling is not None
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(branch.pgno, branch.nodes[2].offset), sibling))
    _raises(path, f"page {sibling}", "reached a second time")


def test_copied_and_swapped_pages(bases: list[Base], tmp_path: Path) -> None:
    first, second = _leaf(bases[1], index=0), _leaf(bases[1], index=1)

    def copy(m: Mutation) -> None:
        m.set_page(second.pgno, m.page_bytes(first.pgno))

    _raises(_damaged(bases[1], tmp_path, copy), f"page {second.pgno}", f"header says page {first.pgno}")

    def duplicate(m: Mutation) -> None:  # the copy renumbered: only the keys show it
        copy(m)
        m.put("Q", m.at(second.pgno), second.pgno)

    _raises(_damaged(bases[1], tmp_path, duplicate), f"page {second.pgno}", "keys out of order")

    def swap(m: Mutation) -> None:
        a, b = m.page_bytes(first.pgno), m.page_bytes(second.pgno)
        m.set_page(first.pgno, b)
        m.set_page(second.pgno, a)
        m.put("Q", m.at(first.pgno), first.pgno)
        m.put("Q", m.at(second.pgno), second.pgno)

    _raises(_damaged(bases[1], tmp_path, swap), f"page {first.pgno}", "separator key", "out of order")


def test_page_header_fields(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[2])
    path = _damaged(bases[2], tmp_path, lambda m: m.put("H", m.at(leaf.pgno, 10), 0x22))  # P_LEAF | P_LEAF2
    _raises(path, f"page {leaf.pgno}", "page flags 0x0022 where a leaf page (0x0002) must be")
    path = _damaged(bases[2], tmp_path, lambda m: m.put("H", m.at(leaf.pgno, 12), 4094))
    _raises(path, f"page {leaf.pgno}", "free-space bounds lower=4094")


def test_meta_page_fields(bases: list[Base], tmp_path: Path) -> None:
    base = bases[0]
    path = _damaged(base, tmp_path, lambda m: m.put("I", m.at(1, 16), 0))
    _raises(path, "page 1 (meta page)", "magic 0x00000000")
    path = _damaged(base, tmp_path, lambda m: m.put("I", m.at(0, 40), 4097))
    _raises(path, "page size 4097 is not a power of two")
    current = (
        1 if struct.unpack_from("=Q", base.data, 144)[0] < struct.unpack_from("=Q", base.data, 4096 + 144)[0] else 0
    )
    path = _damaged(base, tmp_path, lambda m: m.put("Q", m.at(current, 136), 1 << 40))
    _raises(path, f"page {current}", "the last page in use is 1099511627776")
    path = _damaged(base, tmp_path, lambda m: m.put("Q", m.at(current, 128), 1))  # main database root
    _raises(path, "page 1 (leaf page of the main database", "outside the data pages")
    with_magic = _damaged(base, tmp_path, lambda m: m.put("I", m.at(0, 16), 0))
    with pytest.raises(NotARecordSetError, match="not an LMDB file"):
        check_structure(with_magic)


def test_named_database_record(bases: list[Base], tmp_path: Path) -> None:
    main = next(p for p in bases[1].pages if "main" in p.database)
    for node in main.nodes:
        name = bases[1].data[main.pgno * 4096 + node.offset + 8 :][: node.key_size]
        if name == b"records":
            record = node.offset + 8 + node.key_size
    path = _damaged(bases[1], tmp_path, lambda m: m.put("Q", m.at(main.pgno, record + 32), 401))
    _raises(path, "database 'records' holds 400 entries, its record says 401")
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(main.pgno, record + 4), 0x04))
    _raises(path, f"page {main.pgno}", "database 'records' has flags 0x0004")
    # a root page number above 2**63 (found by the campaign: it once escaped as OverflowError)
    for name, rel in ((b"meta", 40), (b"records", 40), (b"crc32", 40)):
        node = next(n for n in main.nodes if bases[1].data[main.pgno * 4096 + n.offset + 8 :][: n.key_size] == name)
        at = node.offset + 8 + node.key_size + rel
        path = _damaged(bases[1], tmp_path, lambda m, at=at: m.put("Q", m.at(main.pgno, at), 9544842990936377143))
        _raises(path, "page 9544842990936377143", "outside the data pages")


def test_key_bytes_and_node_flags(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[1])
    node = leaf.nodes[5]
    path = _damaged(bases[1], tmp_path, lambda m: m.put("B", m.at(leaf.pgno, node.offset + 8 + 7), 0xFF))
    _raises(path, f"page {leaf.pgno}", "node 5's key 0x00000000000000ff", "out of order")
    path = _damaged(bases[1], tmp_path, lambda m: m.put("H", m.at(leaf.pgno, node.offset + 4), 0x04))
    _raises(path, f"page {leaf.pgno}", "node 5 has flags 0x4")


def test_zeroed_page_and_truncated_file(bases: list[Base], tmp_path: Path) -> None:
    leaf = _leaf(bases[1], "crc32")
    path = _damaged(bases[1], tmp_path, lambda m: m.set_page(leaf.pgno, bytes(4096)))
    _raises(path, f"page {leaf.pgno} (leaf page of the database 'crc32'", "header says page 0")

    def truncate(m: Mutation) -> None:
        del m.data[len(m.data) - 4096 :]

    _raises(_damaged(bases[1], tmp_path, truncate), "the last page in use is", "truncated?")


def test_not_lmdb_missing_fifo_and_directory(tmp_path: Path) -> None:
    with pytest.raises(RecordNotFoundError):
        check_structure(tmp_path / "absent.tr")
    with pytest.raises(NotARecordSetError, match="not a regular file"):
        check_structure(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotARecordSetError, match="not a regular file"):  # and does not block
        check_structure(fifo)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(NotARecordSetError, match="too short"):
        check_structure(tmp_path / "empty")
    (tmp_path / "text").write_bytes(b"hello world" * 1000)
    with pytest.raises(NotARecordSetError, match="not an LMDB file"):
        check_structure(tmp_path / "text")


def test_memory_is_bounded_by_the_file_not_its_claims(bases: list[Base], tmp_path: Path) -> None:
    """Huge claims (last page, overflow runs, depth, entries) cost nothing: checked against the file first."""
    base = bases[0]
    _leaf_page, node = next((p, n) for p in base.pages if p.kind == "leaf" for n in p.nodes if n.child)
    assert node.child is not None
    changes = [
        lambda m: [m.put("Q", m.at(n, 136), (1 << 64) - 1) for n in (0, 1)],
        lambda m: m.put("I", m.at(node.child, 12), 0xFFFFFFFF),
        lambda m: [m.put("H", m.at(n, 88 + 6), 0xFFFF) for n in (0, 1)],
        lambda m: [m.put("Q", m.at(n, 88 + 32), (1 << 64) - 1) for n in (0, 1)],
    ]
    for change in changes:
        path = _damaged(base, tmp_path, change)

        def check(path: str = path) -> str:
            try:
                check_structure(path)
            except StructureError as exc:
                return str(exc)
            return "passed"

        outcome = run_in_child(check, timeout=30, memory_limit=64 << 20)
        assert outcome.status == "returned" and outcome.value != "passed", outcome


def test_a_large_set_is_checked_in_bounded_time(tmp_path: Path) -> None:
    """About 8 MB, 40,000 records: well under a second (cost grows linearly with the file)."""
    path = _write(tmp_path, [(np.arange(16, dtype=np.float32), i) for i in range(40_000)])
    info = _both(path)
    assert info.databases[b"records"].entries == 40_000


# -- the campaign --------------------------------------------------------------------------------------------------


def test_vectorized_and_scalar_checks_agree_on_every_mutated_file(bases: list[Base], tmp_path: Path) -> None:
    path = str(tmp_path / "mutant.tr")
    flagged = 0
    for _index, _base, kind, data, description in mutants(600, bases, seed=3):
        if data is None:
            continue
        Path(path).write_bytes(data)
        verdicts = []
        for vector in (True, False):
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    _lmdb_check._Walker(path, fd, len(data), None, vector=vector).run()
                finally:
                    os.close(fd)
                verdicts.append("passed")
            except (StructureError, NotARecordSetError) as exc:
                verdicts.append(str(exc))
        assert verdicts[0] == verdicts[1], (kind, description)
        flagged += verdicts[0] != "passed"
    assert flagged > 400


def _assert_campaign(files: int, tmp_path: Path) -> None:
    """0 crashes, hangs or other exceptions in verify, the check and the readers with check="structure";
    0 wrong data in every read path; the check flags every file a liblmdb path crashed, hung or misread on."""
    campaign = run_campaign(files, str(tmp_path / "campaign"))
    print(campaign.render())
    assert campaign.failures() == {"crash": 0, "hang": 0, "other": 0, "wrong": 0, "missed": 0}, campaign.render()
    assert len(campaign.files) == files and {f.kind for f in campaign.files} == set(KINDS)


def test_mutation_campaign_45_files(tmp_path: Path) -> None:
    _assert_campaign(45, tmp_path)  # every kind on every base once


@pytest.mark.slow
def test_mutation_campaign_300_files(tmp_path: Path) -> None:
    _assert_campaign(300, tmp_path)  # the full campaign: python scripts/mutation_campaign.py --files 2000
