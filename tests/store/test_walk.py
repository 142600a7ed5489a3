"""The cursor walk's checksum comparison: a piece's CRCs compared at once, the record at fault named."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from torchrecord._store.walk import _block_crcs, check_crcs, crcs_match
from torchrecord.errors import ChecksumError, CorruptRecordError

VALUES = [bytes([i]) * (i + 1) for i in range(40)]


def _stored(values: list[bytes]) -> list[bytes]:
    return [zlib.crc32(v).to_bytes(4, "little") for v in values]


def test_matching_checksums_pass_for_bytes_and_views() -> None:
    check_crcs(VALUES, _stored(VALUES), "set.tr", range(100, 140))
    check_crcs([memoryview(v) for v in VALUES], _stored(VALUES), "set.tr", range(100, 140))
    check_crcs([], [], "set.tr", range(0))


def test_a_changed_value_is_named_by_its_record() -> None:
    changed = list(VALUES)
    changed[17] = b"\xff" + changed[17][1:]
    with pytest.raises(ChecksumError, match=r"set\.tr: record 117: CRC-32 is"):
        check_crcs(changed, _stored(VALUES), "set.tr", range(100, 140))


def test_records_scattered_over_the_file_are_named_by_their_index() -> None:
    records = [5, 900, 3, 77]
    stored = _stored(VALUES[:4])
    stored[2] = b"\0\0\0\0"
    with pytest.raises(ChecksumError, match=r"set\.tr: record 3: CRC-32 is"):
        check_crcs(VALUES[:4], stored, "set.tr", records)


def test_a_missing_or_short_checksum_is_an_error() -> None:
    stored: list[bytes | None] = list(_stored(VALUES))
    stored[3] = None
    with pytest.raises(CorruptRecordError, match=r"set\.tr: record 103: no checksum stored"):
        check_crcs(VALUES, stored, "set.tr", range(100, 140))
    stored = list(_stored(VALUES))
    stored[4] = stored[4][:3]
    with pytest.raises(ChecksumError, match=r"record 104: the stored checksum has 3 bytes"):
        check_crcs(VALUES, stored, "set.tr", range(100, 140))


def test_fewer_checksums_than_values_is_an_error() -> None:
    with pytest.raises(ChecksumError, match=r"39 checksums for 40 records from record 100"):
        check_crcs(VALUES, _stored(VALUES)[:39], "set.tr", range(100, 140))


def test_block_crcs_and_crcs_match_agree_with_zlib() -> None:
    """The block CRC-32s (each block joined) and the record-by-record comparison against zlib's CRC-32 of the
    same bytes, with a short last block, empty values and one changed byte."""
    rng = np.random.default_rng(7)
    values = [rng.bytes(int(n)) for n in rng.integers(0, 200, size=103)]
    values[5] = b""
    for size in (1, 2, 16, 103, 500):
        blocks = -(-len(values) // size)
        want = [zlib.crc32(b"".join(values[at : at + size])) for at in range(0, len(values), size)]
        assert _block_crcs(values, size, blocks).tolist() == want
    stored = [zlib.crc32(v).to_bytes(4, "little") for v in values]
    assert crcs_match(values, stored)
    assert not crcs_match(values, stored[:-1])  # a count that differs
    assert not crcs_match(values, [*stored[:-1], None])  # a missing stored checksum
    assert not crcs_match(values, [*stored[:-1], b"\0\0\0"])  # a stored checksum of the wrong length
    changed = list(values)
    changed[40] = bytes([changed[40][0] ^ 1]) + changed[40][1:] if changed[40] else b"\1"
    assert not crcs_match(changed, stored)
