"""check="structure" on readers of files of unknown provenance (issue 20, point 2).

With it on, a file whose LMDB page structure is damaged raises StructureError when
the reader is made, instead of killing the process when liblmdb reads the damage;
the check runs once per file per process and pickled readers (DataLoader workers,
fork and spawn) remember it unless the file changed.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.untrusted import (
    error_or_value,
    keep_identity,
    labels,
    outcome,
    set_node_pointer,
    set_node_size,
    write_set,
)
from torchrecord._store import checked as _checked
from torchrecord.errors import NotARecordSetError, StructureError


def _damaged(tmp_path: Path) -> str:
    """A set on which plain readers die: an overflow value's size set to 0xFFFFFFFF."""
    path = write_set(tmp_path / "big.tr", n=20, size=20000)
    set_node_size(path, "records")
    return path


def _read_file(path: str, check: str | None) -> int:
    return len(list(torchrecord.RecordFile(path, check=check)))


def _read_dataset(path: str, check: str | None) -> int:
    return len(list(torchrecord.RecordDataset(path, check=check, batch_size=4)))


@pytest.mark.parametrize("read", [_read_file, _read_dataset])
def test_a_damaged_file_is_a_structure_error_with_the_check_and_a_crash_without(tmp_path: Path, read: object) -> None:
    path = _damaged(tmp_path)
    plain = outcome(error_or_value, read, path, None)
    assert plain.status == "signal" or plain.value[0] != "ok", plain  # liblmdb reads 4 GB from the map
    checked = outcome(error_or_value, read, path, "structure")
    assert checked.status == "returned", checked
    assert checked.value[0] == "StructureError" and "damaged LMDB structure" in checked.value[1], checked.value


def test_the_check_runs_when_the_reader_is_made(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr")
    set_node_pointer(path, "crc32")
    with pytest.raises(StructureError, match="crc32"):
        torchrecord.RecordFile(path, check="structure")
    with pytest.raises(StructureError, match="crc32"):
        torchrecord.RecordDataset(path, check="structure")
    with pytest.raises(StructureError, match="crc32"):
        torchrecord.RecordDataset(torchrecord.RecordFile(path), check="structure")
    assert len(torchrecord.RecordFile(path)) == 600  # without the check, the records still read


def test_a_good_file_reads_the_same_with_the_check(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=300)
    rf = torchrecord.RecordFile(path, check="structure")
    assert labels(rf) == list(range(300)) and rf[7][1] == 7
    ds = torchrecord.RecordDataset(path, check="structure", shuffle=False, batch_size=64)
    assert labels(ds) == list(range(300))


def test_bad_check_values_are_refused(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    for bad in ("Structure", "crc", True):
        with pytest.raises(ValueError, match="check must be None, 'checksums', 'structure' or 'full'"):
            torchrecord.RecordFile(path, check=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="check must be None, 'checksums', 'structure' or 'full'"):
            torchrecord.RecordDataset(path, check=bad)  # type: ignore[arg-type]


def test_not_a_record_set_is_named_as_without_the_check(tmp_path: Path) -> None:
    image = tmp_path / "cat.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(8000))
    with pytest.raises(NotARecordSetError, match="a PNG image"):
        torchrecord.RecordFile(image, check="structure")
    empty = tmp_path / "empty.tr"
    empty.write_bytes(b"")
    with pytest.raises(NotARecordSetError, match="empty file"):
        torchrecord.RecordFile(empty, check="structure")


def test_the_check_runs_once_per_file_per_process(tmp_path: Path) -> None:
    """Damage the file after it passed, keeping its size and time: no reader of this process checks it again."""
    path = write_set(tmp_path / "set.tr")
    torchrecord.RecordFile(path, check="structure")
    keep_identity(path, lambda p: set_node_pointer(p, "crc32"))
    assert len(torchrecord.RecordFile(path, check="structure")) == 600  # remembered: not checked again
    os.utime(path)  # a new modification time: the file changed, check it again
    with pytest.raises(StructureError):
        torchrecord.RecordFile(path, check="structure")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_do_not_check_again_unless_the_file_changed(tmp_path: Path, context: str) -> None:
    path = write_set(tmp_path / "set.tr", n=200)
    ds = torchrecord.RecordDataset(path, check="structure", shuffle=False, batch_size=50)
    # damage the checksum database (plain reading does not use it), keeping size and time:
    # a worker that checked again would raise StructureError
    keep_identity(path, lambda p: set_node_pointer(p, "crc32"))
    _checked._PASSED.clear()  # only what the pickled dataset carries
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert sorted(labels(loader)) == list(range(200))
    os.utime(path)  # changed since the dataset was made: workers check it again
    with pytest.raises(StructureError):
        list(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=context))


def test_a_pickled_record_file_carries_the_check(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    rf = pickle.loads(pickle.dumps(torchrecord.RecordFile(path, check="structure")))
    assert rf._check == "structure" and rf._checked == _checked.identity(path)
    assert pickle.loads(pickle.dumps(torchrecord.RecordFile(path)))._check is None


def test_mixed_and_stream_datasets_take_the_check(tmp_path: Path) -> None:
    good = write_set(tmp_path / "good.tr", n=50)
    bad = write_set(tmp_path / "bad.tr", n=600)
    set_node_pointer(bad, "crc32")
    with pytest.raises(StructureError):
        torchrecord.MixedDataset([good, bad], check="structure")
    with pytest.raises(StructureError):
        torchrecord.MixedDataset([good, torchrecord.RecordFile(bad, check="structure")])
    assert len(torchrecord.MixedDataset([good, bad])) > 0  # the records themselves are fine
    grouped = str(tmp_path / "grouped.tr")
    torchrecord.write_record(
        [{"x": torch.tensor([i]), "g": i // 300} for i in range(600)],
        grouped,
        group_by="g",
        shuffle=False,
        progress=False,
    )
    set_node_pointer(grouped, "crc32")
    with pytest.raises(StructureError):
        torchrecord.StreamDataset(grouped, batch_size=1, check="structure")
    with pytest.raises(StructureError):
        torchrecord.StreamDataset(torchrecord.RecordFile(grouped), batch_size=1, check="structure")


def test_a_sharded_set_checks_each_shard(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    samples = [(torch.full((48,), i % 251, dtype=torch.uint8), i) for i in range(1200)]
    for s in range(2):
        torchrecord.write_shard(samples, folder, shard=s, num_shards=2, shuffle=False, progress=False)
    shard = sorted(str(p) for p in folder.glob("*.tr"))[1]
    set_node_pointer(shard, "crc32")
    rf = torchrecord.open_set(folder, check="structure")
    assert len(rf.shard(0)) == 600
    with pytest.raises(StructureError):
        rf.shard(1)
    assert len(torchrecord.open_set(folder).shard(1)) == 600


def test_robomimic_datasets_take_the_check(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    from tests.robomimic_files import write_demo_file
    from torchrecord.convert import from_robomimic

    write_demo_file(tmp_path / "demo.hdf5", [40, 30, 50], seed=1)
    path = str(tmp_path / "demo.tr")
    from_robomimic(tmp_path / "demo.hdf5", path, progress=False)
    keys = {"obs_keys": ["pos"], "dataset_keys": ["actions"]}
    assert len(torchrecord.WindowDataset(path, **keys, check="structure")) > 0  # type: ignore[arg-type]
    set_node_pointer(path, "crc32")
    with pytest.raises(StructureError):
        torchrecord.WindowDataset(path, **keys, check="structure")  # type: ignore[arg-type]
    with pytest.raises(StructureError):
        torchrecord.SequenceDataset(path, **keys, check="structure")  # type: ignore[arg-type]
