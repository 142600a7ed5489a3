"""Errors: every failure names the file (and the sample and field), and leaves nothing behind."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from tests.conftest import IndexedImages
from torchrecord import RecordDataset, RecordFile, verify
from torchrecord._store import format as _format
from torchrecord.errors import (
    FormatError,
    IncompleteRecordSetError,
    NotARecordSetError,
    RecordExistsError,
    RecordNotFoundError,
    SchemaError,
    SourceError,
    TorchRecordError,
    VersionError,
    WriteError,
)

MakeRecord = Callable[..., str]

_REWRITE_META = textwrap.dedent(
    """
    import sys, lmdb, msgpack, json
    path, changes = sys.argv[1], json.loads(sys.argv[2])
    env = lmdb.open(path, subdir=False, lock=False, max_dbs=4)
    db = env.open_db(b"meta", create=False)
    with env.begin(write=True, db=db) as txn:
        meta = msgpack.unpackb(txn.get(b"metadata"), raw=False)
        meta.update(changes)
        txn.put(b"metadata", msgpack.packb(meta, use_bin_type=True))
    env.close()
    """
)


def rewrite_metadata(path: str, **changes: Any) -> None:
    """Edit a record set's metadata with raw lmdb + msgpack, in a separate process.

    A separate process, because py-lmdb refuses to open a file twice in one
    process and torchrecord keeps its environments open.
    """
    import json

    subprocess.run([sys.executable, "-c", _REWRITE_META, path, json.dumps(changes)], check=True, timeout=60)


def _open_everything(path: str | Path) -> None:
    """Every way a user opens a record set; each must raise."""
    len(RecordFile(path))


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- opening --------------------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "missing.tr"
    for attempt in (
        lambda: len(RecordFile(path)),
        lambda: RecordFile(path)[0],
        lambda: RecordFile(path).schema,
        lambda: list(RecordDataset(path)),
        lambda: len(RecordDataset(path)),
        lambda: verify(path),
    ):
        with pytest.raises(RecordNotFoundError, match=r"missing\.tr") as info:
            attempt()
        assert isinstance(info.value, FileNotFoundError)
        assert str(path) in str(info.value)
    assert not path.exists(), "reading must not create the file"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", [b"this is not an LMDB file\n" * 500, b"", b"\x00" * 8192])
def test_plain_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "plain.tr"
    path.write_bytes(content)
    with pytest.raises(NotARecordSetError, match=r"plain\.tr"):
        _open_everything(path)
    with pytest.raises(NotARecordSetError):
        list(RecordDataset(path))
    assert path.read_bytes() == content, "a failed open must not modify the file"
    assert sorted(os.listdir(tmp_path)) == ["plain.tr"], "no lock file may be created"


def test_lmdb_without_torchrecord_metadata(tmp_path: Path) -> None:
    path = tmp_path / "other.lmdb"
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    with pytest.raises(NotARecordSetError, match=r"other\.lmdb") as info:
        _open_everything(path)
    assert "metadata" in str(info.value)


def test_lmdb_with_foreign_metadata(tmp_path: Path) -> None:
    import msgpack

    path = tmp_path / "foreign.lmdb"
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=4)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        txn.put(b"metadata", msgpack.packb({"format": "something-else", "format_version": 1}))
    env.close()
    with pytest.raises(NotARecordSetError, match=r"foreign\.lmdb"):
        _open_everything(path)


def test_lmdb_with_garbage_metadata(tmp_path: Path) -> None:
    path = tmp_path / "garbage.lmdb"
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=4)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        txn.put(b"metadata", b"\xc1\xc1 not msgpack")
    env.close()
    with pytest.raises(NotARecordSetError, match=r"garbage\.lmdb"):
        _open_everything(path)


def test_directory(tmp_path: Path) -> None:
    path = tmp_path / "adir.tr"
    path.mkdir()
    with pytest.raises(NotARecordSetError, match=r"adir\.tr") as info:
        _open_everything(path)
    assert "directory" in str(info.value)
    assert os.listdir(path) == []


def test_newer_format_version(make_record: MakeRecord) -> None:
    path = make_record(IndexedImages(3))
    rewrite_metadata(path, format_version=99)
    with pytest.raises(VersionError) as info:
        _open_everything(path)
    message = str(info.value)
    assert path in message
    rest = message.replace(path, "").replace(torchrecord.__version__, "")
    assert re.search(r"(?<![\d.])99(?!\.?\d)", rest), "the file's version is not named"
    supported = _format.FORMAT_VERSION
    assert re.search(rf"(?<![\d.]){supported}(?!\.?\d)", rest), "the supported version is not named"
    assert "upgrade" in message.lower()
    assert isinstance(info.value, FormatError) and isinstance(info.value, ValueError)
    with pytest.raises(VersionError):
        list(RecordDataset(path))


def test_incomplete_record_set(make_record: MakeRecord) -> None:
    path = make_record(IndexedImages(3))
    rewrite_metadata(path, complete=False)
    with pytest.raises(IncompleteRecordSetError, match=os.path.basename(path)) as info:
        _open_everything(path)
    assert "write it again" in str(info.value)
    with pytest.raises(IncompleteRecordSetError):
        verify(path)


def test_metadata_rewrite_is_seen(make_record: MakeRecord) -> None:
    """Control for the two tests above: the rewrite helper really reaches the reader."""
    path = make_record(IndexedImages(3))
    rewrite_metadata(path, user={"edited": True})
    assert RecordFile(path).user_metadata == {"edited": True}


# -- schema ---------------------------------------------------------------------------


def _dicts(n: int, bad_at: int, bad: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    good = [{"image": torch.zeros(3, 4, dtype=torch.float32), "label": i} for i in range(n)]
    good[bad_at] = bad(bad_at)
    return good


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (lambda i: {"image": torch.zeros(3, 4, dtype=torch.float64), "label": i}, ["'image'", "float64", "float32"]),
        (lambda i: {"image": np.zeros((3, 4), dtype=np.float32), "label": i}, ["'image'", "ndarray", "tensor"]),
        (lambda i: {"image": torch.zeros(3, 4), "label": float(i)}, ["'label'", "float", "int"]),
        (lambda i: {"image": torch.zeros(3, 4, 1), "label": i}, ["'image'", "rank 3", "rank 2"]),
        (lambda i: {"image": torch.zeros(12), "label": i}, ["'image'", "rank 1"]),
        (lambda i: {"image": torch.zeros(3, 4), "label": i, "extra": 1}, ["extra", "structure"]),
        (lambda i: {"label": i, "image": torch.zeros(3, 4)}, ["structure"]),
        (lambda i: (torch.zeros(3, 4), i), ["structure"]),
        (lambda i: {"image": [torch.zeros(3, 4)], "label": i}, ["structure"]),
    ],
    ids=["dtype", "kind", "scalar-kind", "rank-up", "rank-down", "extra-field", "key-order", "tuple", "nesting"],
)
def test_inconsistent_samples(tmp_path: Path, bad: Callable[[int], Any], words: list[str]) -> None:
    path = tmp_path / "schema.tr"
    with pytest.raises(SchemaError) as info:
        torchrecord.write_record(_dicts(12, 7, bad), path, shuffle=False, progress=False)
    message = str(info.value)
    assert "sample 7" in message
    assert str(path) in message
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert os.listdir(tmp_path) == [], "a failed write leaves nothing behind"


def test_schema_error_names_the_source_index_when_shuffled(tmp_path: Path) -> None:
    n, bad_at, seed = 12, 7, 0
    assert np.random.default_rng(seed).permutation(n)[0] != bad_at
    samples = _dicts(n, bad_at, lambda i: {"image": torch.zeros(3, 4, dtype=torch.int32), "label": i})
    with pytest.raises(SchemaError, match=f"sample {bad_at}\\b"):
        torchrecord.write_record(samples, tmp_path / "s.tr", seed=seed, progress=False)
    assert os.listdir(tmp_path) == []


def test_variable_size_is_not_a_schema_error(make_record: MakeRecord) -> None:
    samples = [{"image": torch.zeros(3, i + 1), "label": i} for i in range(4)]
    with pytest.warns(torchrecord.errors.VariableShapeWarning, match="'image'"):  # a warning, not an error
        rf = RecordFile(make_record(samples))
    assert tuple(rf.schema.fields[0].shape) == (3, None)


# -- existing targets -----------------------------------------------------------------


def test_existing_path_without_overwrite(make_record: MakeRecord, tmp_path: Path) -> None:
    path = make_record(IndexedImages(5), name="keep.tr")
    before = _sha(path)
    with pytest.raises(RecordExistsError, match=r"keep\.tr") as info:
        torchrecord.write_record(IndexedImages(9), path, progress=False)
    assert "overwrite=True" in str(info.value)
    assert isinstance(info.value, FileExistsError)
    assert _sha(path) == before, "the old file was modified"
    assert len(RecordFile(path)) == 5
    assert sorted(os.listdir(tmp_path)) == ["keep.tr"]


def test_existing_plain_file_without_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("precious")
    with pytest.raises(RecordExistsError):
        torchrecord.write_record(IndexedImages(2), path, progress=False)
    assert path.read_text() == "precious"


def test_overwrite_replaces(make_record: MakeRecord, tmp_path: Path) -> None:
    path = make_record(IndexedImages(5), name="swap.tr", shuffle=False)
    old = RecordFile(path)
    assert len(old) == 5 and old[4][1] == 4  # opened in this process before the overwrite
    torchrecord.write_record([(torch.ones(2), "new", i) for i in range(8)], path, overwrite=True, progress=False)
    fresh = RecordFile(path)
    assert len(fresh) == 8
    assert fresh.schema.names == ["0", "1", "2"]
    assert sorted(s[2] for s in fresh) == list(range(8))
    assert sorted(s[2] for s in RecordDataset(path)) == list(range(8))
    assert sorted(os.listdir(tmp_path)) == ["swap.tr"]


def test_overwrite_does_not_replace_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "dir.tr"
    path.mkdir()
    with pytest.raises(RecordExistsError, match="directory"):
        torchrecord.write_record(IndexedImages(2), path, overwrite=True, progress=False)
    assert path.is_dir()


def test_failed_overwrite_keeps_the_old_file(make_record: MakeRecord) -> None:
    path = make_record(IndexedImages(5), name="old.tr")
    before = _sha(path)
    with pytest.raises(SourceError):
        torchrecord.write_record(Flaky(10, {3}), path, overwrite=True, progress=False)
    assert _sha(path) == before
    assert len(RecordFile(path)) == 5


def test_missing_parent_directory(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir.tr"
    with pytest.raises(WriteError, match=r"dir\.tr"):
        torchrecord.write_record(IndexedImages(2), path, progress=False)
    assert os.listdir(tmp_path) == []


# -- source failures ------------------------------------------------------------------


class Flaky(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A map-style source that raises at some indices."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i in self.bad:
            raise RuntimeError(f"cannot decode item {i} (simulated)")
        return torch.full((2,), i), i


def _flaky_stream(n: int, bad_at: int) -> Iterator[tuple[torch.Tensor, int]]:
    for i in range(n):
        if i == bad_at:
            raise OSError(f"stream broke at {i} (simulated)")
        yield torch.full((2,), i), i


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_source_error_names_the_index(tmp_path: Path, num_workers: int, shuffle: bool) -> None:
    path = tmp_path / "flaky.tr"
    with pytest.raises(SourceError) as info:
        torchrecord.write_record(Flaky(300, {137}), path, shuffle=shuffle, num_workers=num_workers, progress=False)
    message = str(info.value)
    assert "sample 137" in message
    assert "cannot decode item 137 (simulated)" in message
    assert "flaky.tr" in message
    assert "on_error='skip'" in message
    assert os.listdir(tmp_path) == [], "nothing (no temporary files either) may be left behind"


def test_source_error_stops_reader_workers_at_once(tmp_path: Path) -> None:
    """The writer's DataLoader workers are shut down when the error is raised, not at some later GC."""
    before = set(multiprocessing.active_children())
    with pytest.raises(SourceError) as info:
        torchrecord.write_record(Flaky(2000, {10}), tmp_path / "w.tr", num_workers=2, progress=False)
    left = set(multiprocessing.active_children()) - before
    assert not left, f"reader workers still running after the error: {left}"
    assert "sample 10" in str(info.value)


@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_source_error_names_the_index(tmp_path: Path, shuffle: bool) -> None:
    with pytest.raises(SourceError) as info:
        torchrecord.write_record(_flaky_stream(50, 23), tmp_path / "s.tr", shuffle=shuffle, progress=False)
    assert "sample 23" in str(info.value)
    assert "stream broke at 23" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_skip_counts_skipped_samples(make_record: MakeRecord) -> None:
    bad = {0, 3, 7, 28}
    rf = RecordFile(make_record(Flaky(30, bad), on_error="skip"))
    assert rf.metadata["skipped"] == 4
    assert len(rf) == rf.metadata["count"] == 26
    assert sorted(s[1] for s in rf) == sorted(set(range(30)) - bad)
    clean = RecordFile(make_record(Flaky(5, set())))
    assert clean.metadata["skipped"] == 0


def test_skip_does_not_hide_a_finished_generator(tmp_path: Path) -> None:
    # a generator that raised is finished: skipping would silently drop samples 5..9
    path = tmp_path / "s.tr"
    with pytest.raises(SourceError, match=r"(?s)sample 4.*cannot be skipped"):
        torchrecord.write_record(_flaky_stream(10, 4), path, on_error="skip", shuffle=False, progress=False)
    assert not path.exists()


@pytest.mark.parametrize(
    ("leaf", "words"),
    [
        (object(), ["object"]),
        ({1, 2}, ["set"]),
        (None, ["is None", "give it a value"]),
        (1 + 2j, ["complex"]),
        (np.zeros(3, dtype=np.complex64), ["complex64"]),
        (np.array(["a", "b"]), ["<U1"]),
        (torch.zeros(2, dtype=torch.complex64), ["complex64"]),
        (2**64, ["int64"]),
    ],
    ids=["object", "set", "none", "complex", "np-complex", "np-str", "torch-complex", "big-int"],
)
def test_unsupported_leaf(tmp_path: Path, leaf: Any, words: list[str]) -> None:
    samples = [(torch.zeros(1), i) for i in range(5)]
    samples[2] = (leaf, 2)  # type: ignore[assignment]
    with pytest.raises(TorchRecordError) as info:
        torchrecord.write_record(samples, tmp_path / "u.tr", shuffle=False, progress=False)
    message = str(info.value)
    assert "sample 2" in message
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert os.listdir(tmp_path) == []


def test_dict_with_non_str_keys(tmp_path: Path) -> None:
    with pytest.raises(TorchRecordError, match="str") as info:
        torchrecord.write_record([{1: torch.zeros(1)}], tmp_path / "k.tr", progress=False)
    assert "sample 0" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"on_error": "ignore"}, ValueError),
        ({"metadata": [("a", 1)]}, TypeError),
        ({"samples_per_record": 0}, ValueError),
    ],
)
def test_bad_write_arguments(tmp_path: Path, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        torchrecord.write_record(IndexedImages(2), tmp_path / "a.tr", progress=False, **kwargs)
    assert os.listdir(tmp_path) == []


def test_unpicklable_metadata_value_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises((TypeError, TorchRecordError)):
        torchrecord.write_record(IndexedImages(2), tmp_path / "m.tr", metadata={"x": object()}, progress=False)
    assert os.listdir(tmp_path) == []
