"""A wrong path fails when RecordDataset is made, with a message saying what the path holds and what to do."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
import torch

import torchrecord
from torchrecord import RecordDataset
from torchrecord.errors import NotARecordSetError, RecordNotFoundError

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(4000)


def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.tr"
    with pytest.raises(RecordNotFoundError, match=r"nope\.tr: no record set here"):
        RecordDataset(path)


def test_directory_of_images_points_to_convert(tmp_path: Path) -> None:
    for label in ("cat", "dog"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        (tmp_path / "photos" / label / "1.JPG").write_bytes(JPEG)
    path = tmp_path / "photos"
    with pytest.raises(NotARecordSetError, match="directory of images") as info:
        RecordDataset(path)
    assert f"torchrecord convert {path} OUT.tr" in str(info.value)


def test_other_directories(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotARecordSetError, match="is a directory; a torchrecord record set is a single file"):
        RecordDataset(tmp_path / "empty")
    env = lmdb.open(str(tmp_path / "envdir"))
    env.close()
    with pytest.raises(NotARecordSetError, match=r"LMDB environment \(data.mdb\), not a torchrecord record set"):
        RecordDataset(tmp_path / "envdir")


@pytest.mark.parametrize(
    ("content", "kind"),
    [(JPEG, "a JPEG image"), (b"\x89PNG\r\n\x1a\n" + bytes(100), "a PNG image"), (b"\x93NUMPY" + bytes(100), "npy")],
)
def test_image_or_array_file_points_to_convert(tmp_path: Path, content: bytes, kind: str) -> None:
    path = tmp_path / "thing.tr"
    path.write_bytes(content)
    with pytest.raises(NotARecordSetError, match=kind) as info:
        RecordDataset(path)
    assert "torchrecord convert" in str(info.value) and str(path) in str(info.value)


def test_plain_lmdb_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.lmdb"
    env = lmdb.open(str(path), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    with pytest.raises(NotARecordSetError, match="without torchrecord metadata") as info:
        RecordDataset(path)
    assert str(path) in str(info.value)


def test_good_path_is_checked_yet_keeps_no_handle(make_record: Callable[..., str]) -> None:
    path = make_record([torch.tensor([i]) for i in range(10)])
    ds = RecordDataset(path, shuffle=False)
    assert ds.file._handle is None, "the dataset must not hold an open environment"
    copy = pickle.loads(pickle.dumps(ds))
    assert sorted(int(x) for x in copy) == list(range(10))


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_bad_seed_fails_at_construction(make_record: Callable[..., str], seed: object) -> None:
    path = make_record(range(4))
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        RecordDataset(path, seed=seed)  # type: ignore[arg-type]
    assert len(RecordDataset(path, seed=2**70)) == 4  # big seeds are fine


def test_the_error_classes_keep_builtin_bases(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RecordDataset(tmp_path / "nope.tr")
    (tmp_path / "a.jpg").write_bytes(JPEG)
    with pytest.raises(ValueError):
        RecordDataset(tmp_path / "a.jpg")
    assert torchrecord.errors.NotARecordSetError.__mro__
