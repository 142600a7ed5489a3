"""verify on files of unknown provenance (issue 20, point 1): it never crashes or hangs.

LMDB's page structure is checked in pure Python before anything maps the file, and
the liblmdb walk runs in a forked child whose death by a signal or a timeout is
reported as a StructureError; ``torchrecord verify`` exits 1 with the reason. Every
read of a damaged file runs in a forked child here, so a regression fails the test
instead of killing pytest.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest

import torchrecord
from tests.untrusted import error_or_value, outcome, set_meta, set_node_pointer, set_node_size, write_set
from torchrecord import cli
from torchrecord._store.lmdb_check import DatabaseInfo, StructureInfo
from torchrecord.errors import FormatError, StructureError

verify_module = importlib.import_module("torchrecord._check.verify")  # the module (torchrecord.verify is the function)


def _verify(path: str) -> list[object]:
    return error_or_value(lambda p: torchrecord.verify(p, progress=False).ok, path)


@pytest.mark.parametrize("database", ["records", "crc32"])
def test_a_node_pointer_set_to_0xffff_is_a_structure_error_not_a_crash(tmp_path: Path, database: str) -> None:
    path = write_set(tmp_path / "set.tr")
    pgno = set_node_pointer(path, database)
    result = outcome(_verify, path)
    assert result.status == "returned", result  # it used to die by SIGSEGV / SIGBUS
    kind, message = result.value
    assert kind == "StructureError", result.value
    assert f"page {pgno}" in message, message


def test_only_the_checksum_database_damaged_plain_reading_still_works(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr")
    set_node_pointer(path, "crc32")
    got = outcome(lambda p: len(list(torchrecord.RecordFile(p))), path)
    assert got.status == "returned" and got.value == 600  # the records are fine
    result = outcome(_verify, path)
    assert result.status == "returned" and result.value[0] == "StructureError", result


def test_a_death_of_the_checking_process_is_a_structure_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage the structural check does not see (it is turned off here) kills the child, not the caller."""
    path = write_set(tmp_path / "set.tr", n=20, size=20000)  # every record in an overflow run
    set_node_size(path, "records")
    monkeypatch.setattr(verify_module, "check_structure", _no_check)
    with pytest.raises(StructureError, match="was killed by SIG"):
        torchrecord.verify(path, progress=False)


def _no_check(path: str) -> StructureInfo:
    info = DatabaseInfo(20, 1, None, 0, 1, 0)
    return StructureInfo(path, 4096, 0, 0, 0, info, {b"records": info})


def test_a_checking_process_that_hangs_is_a_structure_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_set(tmp_path / "set.tr")
    monkeypatch.setattr(verify_module, "_verify_chunk", lambda *args: time.sleep(60))
    start = time.monotonic()
    with pytest.raises(StructureError, match="did not finish in 1 s"):
        torchrecord.verify(path, progress=False, timeout=1)
    assert time.monotonic() - start < 30


def test_a_good_file_verifies_in_a_child_and_reports_bad_records(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=5000)  # more than one chunk of 4,096 records
    report = torchrecord.verify(path, progress=False)
    assert report.ok and report.records == 5000


def test_a_count_the_file_cannot_hold_is_an_error_not_a_hang(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=100)
    set_meta(path, count=10**12, records=10**12)
    result = outcome(_verify, path, timeout=60)
    assert result.status == "returned", result  # used to run practically forever
    assert result.value[0] == "FormatError" and "holds 100 records" in result.value[1]


def test_a_count_of_2_to_the_64_minus_1_is_a_format_error(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=100)
    set_meta(path, count=2**64 - 1, records=2**64 - 1)
    with pytest.raises(FormatError, match="claims 18446744073709551615 samples"):
        torchrecord.verify(path, progress=False)


def test_the_command_line_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_set(tmp_path / "set.tr")
    set_node_pointer(path, "crc32")
    result = outcome(lambda p: cli.main(["verify", "-q", p]), path)
    assert result.status == "returned" and result.value == 1, result
    assert cli.main(["verify", "-q", path]) == 1
    err = capsys.readouterr().err
    assert "torchrecord verify: error:" in err and "damaged LMDB structure" in err and path in err
