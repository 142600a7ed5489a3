"""The cursor walk's checksum comparison: a piece's CRCs compared at once, the record at fault named."""

from __future__ import annotations

import zlib

import pytest

from torchrecord._store.walk import check_crcs
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
