"""view_addresses: the addresses and lengths of many buffers, read at once, equal what each buffer says."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np
import pytest

from torchrecord._store import addresses
from torchrecord._store.addresses import address_of, view_addresses


def _slow(views: list[memoryview]) -> tuple[list[int], list[int]]:
    return [address_of(v) for v in views], [len(v) for v in views]


def test_views_of_an_lmdb_map_are_located_exactly(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 26)
    rng = np.random.default_rng(0)
    with env.begin(write=True) as txn:
        for i in range(300):  # short values in leaf pages, long ones in overflow pages
            txn.put(i.to_bytes(8, "big"), rng.bytes(int(rng.integers(1, 20_000))))
    with env.begin(buffers=True) as txn:
        views = [v for _, v in txn.cursor().iternext()]
        got_addresses, got_lengths = view_addresses(views)
        want_addresses, want_lengths = _slow(views)
        assert got_addresses.tolist() == want_addresses and got_lengths.tolist() == want_lengths
    env.close()


def test_slices_and_other_buffers_are_located_exactly() -> None:
    owner = np.arange(1000, dtype=np.uint8)
    views = [memoryview(owner)[i : i + 7 * i] for i in range(50)]  # empty, short and overlapping
    assert [a.tolist() for a in view_addresses(views)] == [list(x) for x in _slow(views)]
    mixed: list[object] = [b"abc", bytearray(5), owner[3:9]]  # not memoryviews: each asked the slow way
    got_addresses, got_lengths = view_addresses(mixed)  # type: ignore[arg-type]
    assert got_addresses.tolist() == [address_of(b) for b in mixed] and got_lengths.tolist() == [3, 5, 6]


def test_the_probed_layout_is_found_on_this_python() -> None:
    # CI runs CPython 3.10-3.13 on 64 bits: the vectorized path must be the one that runs there
    assert addresses._BUF_OFFSET is not None


def test_a_wrong_offset_is_an_error_not_a_misread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addresses, "_BUF_OFFSET", addresses._BUF_OFFSET + 8)  # type: ignore[operator]
    owner = np.arange(100, dtype=np.uint8)
    with pytest.raises(AssertionError, match="layout"):
        view_addresses([memoryview(owner)[i:] for i in range(10)])
