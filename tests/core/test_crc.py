"""The fast CRC-32 is zlib's: the same value for every input, so the format is unchanged."""

from __future__ import annotations

import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from torchrecord._core import crc
from torchrecord._store import format as _format


def _inputs() -> list[object]:
    rng = np.random.default_rng(7)
    blob = rng.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    view = memoryview(blob)
    return [b"", b"a", blob, view[3:4099], view[1:], bytearray(blob[:777]), np.frombuffer(blob, np.uint8)[5:900]]


@pytest.mark.parametrize("case", range(len(_inputs())))
def test_the_chosen_crc32_equals_zlibs(case: int) -> None:
    data = _inputs()[case]
    assert crc.crc32(data) == zlib.crc32(data)  # type: ignore[arg-type]


def test_isal_when_installed_equals_zlib_on_every_length() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert crc.CRC32_BACKEND == "isal"
    blob = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    for n in range(0, 5000, 37):
        assert isal_zlib.crc32(blob[:n]) == zlib.crc32(blob[:n]), n


def test_stored_checksums_are_zlibs_crc32(tmp_path: Path) -> None:
    """Whatever the backend, every stored checksum is zlib.crc32 of the value: old and new files agree."""
    path = tmp_path / "set.tr"
    samples = [{"x": torch.arange(i, i + 50, dtype=torch.int32)} for i in range(40)]
    torchrecord.write_record(samples, path)
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=False, max_dbs=_format.MAX_DBS)
    try:
        records, crcs = env.open_db(_format.RECORDS_DB), env.open_db(_format.CRC_DB)
        with env.begin() as txn:
            stored = dict(txn.cursor(db=crcs))
            values = dict(txn.cursor(db=records))
    finally:
        env.close()
    assert values and stored.keys() == values.keys()
    for key, value in values.items():
        assert int.from_bytes(stored[key], "little") == zlib.crc32(value)
    assert sum(1 for _ in torchrecord.RecordDataset(path, check="checksums")) == 40
