"""Manifests as untrusted input (issue 30, findings 9 and 10): every crafted manifest is a torchrecord
error naming the path, or reads exactly the samples written; nothing hangs, nothing reads wrong data."""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import torchrecord
from tests.conftest import IndexedImages
from torchrecord import RecordDataset, open_set, verify, write_shard
from torchrecord._shards.manifest import MAX_SHARDS, manifest_set_id
from torchrecord.errors import FormatError, NotARecordSetError, TorchRecordError

SHARDS, COUNT = 4, 200


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("manifest") / "set")
    for i in range(SHARDS):
        write_shard(IndexedImages(COUNT), folder, shard=i, num_shards=SHARDS, seed=3, progress=False)
    return folder


@pytest.fixture
def folder(base: str, tmp_path: Path) -> str:
    out = str(tmp_path / "set")
    shutil.copytree(base, out)
    return out


def _manifest(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, "manifest.json")) as f:
        return dict(json.load(f))


def _write(folder: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def _labels(folder: str) -> list[int]:
    return [int(s[1]) for s in RecordDataset(folder, shuffle=False, check="structure")]


def _total(m: dict[str, Any]) -> dict[str, Any]:
    m["count"] = sum(s["count"] for s in m["shards"])
    return m


def test_a_good_manifest_reads_every_sample_once(folder: str) -> None:
    assert sorted(_labels(folder)) == list(range(COUNT))
    assert verify(folder, progress=False).ok


def test_a_fifo_manifest_is_refused_without_blocking(folder: str) -> None:
    manifest = os.path.join(folder, "manifest.json")
    os.remove(manifest)
    os.mkfifo(manifest)
    from torchrecord.cli import main

    def attempts() -> None:
        for attempt in (
            lambda: open_set(folder),
            lambda: len(open_set(manifest)),
            lambda: verify(folder, progress=False),
            lambda: RecordDataset(folder),
        ):
            with pytest.raises(NotARecordSetError, match=r"manifest.json: not a regular file"):
                attempt()
        assert main(["info", folder]) == 1 and main(["head", folder]) == 1

    worker = threading.Thread(target=attempts, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # unblock the reader: open the FIFO for writing so the test can end
        fd = os.open(manifest, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("reading a FIFO manifest blocked")


def test_a_shard_whose_count_says_zero_is_refused(folder: str) -> None:
    m = _manifest(folder)
    m["shards"][1]["count"] = 0  # the total adjusted: 50 samples would silently vanish
    with pytest.raises(FormatError, match="shard entry 1 of the manifest: records 1 do not hold count 0"):
        _labels_of(_total(m), folder)
    m["shards"][1]["records"] = 0  # records adjusted too: the shard itself says otherwise
    with pytest.raises(FormatError, match=r"shard-00001-of-00004.tr: shard 1 is not the file .*count: the file has 50"):
        _labels_of(_total(m), folder)


def _labels_of(m: dict[str, Any], folder: str) -> list[int]:
    _write(folder, m)
    return _labels(folder)


def test_a_shard_listed_twice_is_refused_by_readers_and_verify(folder: str) -> None:
    m = _manifest(folder)
    m["shards"][1] = m["shards"][0]  # 200 samples, 150 distinct, before the fix
    _write(folder, _total(m))
    with pytest.raises(FormatError, match=r"the name 'shard-00000-of-00004.tr' is not 'shard-00001-of-00004.tr'"):
        _labels(folder)
    with pytest.raises(FormatError, match=r"is not 'shard-00001-of-00004.tr'"):
        verify(folder, progress=False)
    m["shards"][1] = dict(m["shards"][0], name="shard-00001-of-00004.tr")
    _write(folder, _total(m))
    with pytest.raises(FormatError, match="shard entries 0 and 1 of the manifest have the same set_id"):
        verify(folder, progress=False)


def test_a_shard_file_copied_over_another_is_refused(folder: str) -> None:
    shutil.copy(os.path.join(folder, "shard-00000-of-00004.tr"), os.path.join(folder, "shard-00001-of-00004.tr"))
    with pytest.raises(FormatError, match="shard 1 is not the file the manifest lists"):
        _labels(folder)
    m = _manifest(folder)  # the manifest rewritten to name the copy's set_id: the recomputed set_id differs
    m["shards"][1]["set_id"] = m["shards"][0]["set_id"][::-1]
    _write(folder, m)
    with pytest.raises(FormatError, match=r"set_id .* is not the one its shards' set_ids give"):
        _labels(folder)
    m["set_id"] = manifest_set_id([s["set_id"] for s in m["shards"]])
    _write(folder, m)
    with pytest.raises(FormatError, match=r"shard 1 is not the file the manifest lists .*set_id: the file has"):
        _labels(folder)


def test_one_shard_listed_many_times_is_refused(folder: str) -> None:
    m = _manifest(folder)
    m["shards"] = [m["shards"][0]] * 100_000
    with pytest.raises(FormatError, match="shard entry 0 of the manifest: the name"):
        _labels_of(_total(m), folder)
    m["shards"] = [m["shards"][0]] * (MAX_SHARDS + 1)
    with pytest.raises(FormatError, match=f"lists {MAX_SHARDS + 1} shards, more than the {MAX_SHARDS}"):
        _labels_of(_total(m), folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["shards"][0].update(count=2**63), "records 1 do not hold count 9223372036854775808"),
        (lambda m: m["shards"][0].update(count=10**18), "records 1 do not hold count 1000000000000000000"),
        (
            lambda m: m["shards"][0].update(count=10**18, records=10**18 // m["samples_per_record"] + 1),
            "does not fit in its bytes",
        ),
        (lambda m: m["shards"][0].update(count=-1), "count -1 is negative"),
        (lambda m: m["shards"][0].update(count=True), "count 'True' is not a int"),
        (lambda m: m["shards"][0].update(name="shard\0.tr"), "the name 'shard\\\\x00.tr' is not"),
        (lambda m: m["shards"][0].update(name="a" * 5000), "the name 'aaaa"),
        (lambda m: m["shards"][0].update(name="../shard-00000-of-00004.tr"), "the name '../shard"),
        (lambda m: m["shards"][0].pop("sha256"), "sha256 'None' is not a str"),
        (lambda m: m.update(samples_per_record=2**40), "samples_per_record 1099511627776 is not in"),
        (lambda m: m.update(set_id="0" * 32), "set_id 0+ is not the one its shards' set_ids give"),
    ],
)
def test_crafted_fields_are_format_errors_naming_path_and_field(folder: str, change: Any, message: str) -> None:
    m = copy.deepcopy(_manifest(folder))
    change(m)
    if isinstance(m["shards"][0].get("count"), int) and not isinstance(m["shards"][0]["count"], bool):
        _total(m)
    with pytest.raises(FormatError, match=message) as caught:
        _labels_of(m, folder)
    assert os.path.join(folder, "manifest.json") in str(caught.value)


def test_a_big_count_that_fits_the_manifest_is_refused_by_the_files_size(folder: str) -> None:
    m = _manifest(folder)
    entry = m["shards"][0]
    entry["bytes"] = 1 << 50  # fits the manifest's own claims: 56 bytes a sample, 16 bytes a record
    entry["count"] = (1 << 50) // 56 // m["samples_per_record"] * m["samples_per_record"]
    entry["records"] = entry["count"] // m["samples_per_record"]
    with pytest.raises(FormatError, match=r"shard-00000-of-00004.tr: shard 0 claims \d+ samples .* holds 49152 bytes"):
        _labels_of(_total(m), folder)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"format": "\xff"}', "not UTF-8 text at byte 12"),
        (b"1" * 5000, "not valid JSON"),
    ],
)
def test_malformed_manifest_text_is_a_format_error(folder: str, raw: bytes, message: str) -> None:
    Path(folder, "manifest.json").write_bytes(raw)
    with pytest.raises(FormatError, match=message) as caught:
        open_set(folder)
    assert "manifest.json" in str(caught.value)


def test_a_manifest_symlink_loop_is_named(folder: str) -> None:
    manifest = os.path.join(folder, "manifest.json")
    os.remove(manifest)
    os.symlink(manifest, manifest)
    with pytest.raises(NotARecordSetError, match=r"manifest.json: a symbolic link that loops"):
        open_set(folder)


def test_a_path_with_a_null_byte_is_a_torchrecord_error(folder: str) -> None:
    with pytest.raises(TorchRecordError, match="no sharded-set manifest here"):
        open_set(folder + "/\0/manifest.json")


def test_an_empty_shard_is_still_accepted(tmp_path: Path) -> None:
    folder = str(tmp_path / "few")
    for i in range(3):  # 2 samples over 3 shards: shard 0 holds none
        write_shard(IndexedImages(2), folder, shard=i, num_shards=3, samples_per_record=1, progress=False)
    rs = open_set(folder)
    assert [e["count"] for e in rs.manifest["shards"]] == [0, 1, 1]
    assert sorted(int(s[1]) for s in rs) == [0, 1]
    assert torchrecord.verify(folder, progress=False).ok
