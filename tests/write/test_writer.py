"""RecordWriter: pushed samples published atomically; aborts, exceptions and kills leave nothing.

Also the identity every written set carries (``set_id``) and its stand-in for
files written before it existed.
"""

from __future__ import annotations

import gc
import hashlib
import os
import resource
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from tests.write.test_reliability import (
    FORK,
    Blobs,
    Labelled,
    assert_is_set,
    entries,
    in_child,
    labels_of,
    small_tmpfs,
    temporaries,
)
from torchrecord import RecordFile, RecordWriter
from torchrecord.errors import RecordExistsError, SampleTypeError, SchemaError, WriteError


def _push(path: str | os.PathLike[str], samples: Any, **kwargs: Any) -> RecordFile:
    kwargs.setdefault("progress", False)
    with RecordWriter(path, **kwargs) as w:
        for sample in samples:
            w.append(sample)
    assert w.result is not None
    return w.result


def _samples(n: int) -> list[tuple[torch.Tensor, int]]:
    return [Labelled(n)[i] for i in range(n)]


# -- append and publish ----------------------------------------------------------------------------


def test_append_publishes_only_when_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    with RecordWriter(path, shuffle=False, progress=False) as w:
        for sample in _samples(50):
            w.append(sample)
        assert not path.exists()  # nothing at the target before the end
        pending = [t for t in temporaries(tmp_path, "set.tr") if not t.endswith(".lock")]  # (a .lock beside it)
        assert len(pending) == 1
    rf = w.result
    assert isinstance(rf, RecordFile) and rf.path == str(path)
    assert w.close() is rf  # close after the block: the same result
    assert labels_of(path) == list(range(50))  # shuffle=False keeps the order of append
    assert entries(tmp_path) == ["set.tr"]
    assert rf.metadata["shuffled"] is False and torchrecord.verify(path).ok


def test_close_returns_the_record_file(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "set.tr", progress=False, metadata={"who": "me"})
    w.append({"x": np.arange(3), "name": "a"})
    rf = w.close()
    assert rf is w.result and len(rf) == 1 and rf.user_metadata == {"who": "me"}
    assert rf[0]["name"] == "a" and np.array_equal(rf[0]["x"], np.arange(3))
    with pytest.raises(ValueError, match="published"):
        w.append({"x": np.arange(3), "name": "b"})
    w.abort()  # no effect after a successful close
    assert len(RecordFile(tmp_path / "set.tr")) == 1


def test_shuffle_is_the_seeded_permutation_of_the_appended_order(tmp_path: Path) -> None:
    n = 200
    rf = _push(tmp_path / "a.tr", _samples(n), seed=7)
    order = np.random.default_rng(7).permutation(n)
    assert labels_of(rf.path) == order.tolist()
    assert rf.metadata["shuffled"] is True and rf.metadata["seed"] == 7
    # the same order write_record gives an iterable with the same seed
    torchrecord.write_record(iter(_samples(n)), tmp_path / "b.tr", seed=7, progress=False)
    assert labels_of(tmp_path / "b.tr") == labels_of(rf.path)
    assert labels_of(_push(tmp_path / "c.tr", _samples(n), seed=8).path) != labels_of(rf.path)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("per_record", [1, 4])
def test_samples_per_record(tmp_path: Path, shuffle: bool, per_record: int) -> None:
    n = 30  # not a multiple of 4: the last record holds fewer
    rf = _push(tmp_path / "set.tr", _samples(n), shuffle=shuffle, samples_per_record=per_record)
    assert len(rf) == n and rf.num_records == -(-n // per_record)
    expected = np.random.default_rng(0).permutation(n).tolist() if shuffle else list(range(n))
    assert labels_of(rf.path) == expected
    assert [rf[i][1] for i in range(n)] == expected
    assert torchrecord.verify(rf.path).ok


def test_variable_shapes_and_strings(tmp_path: Path) -> None:
    samples = [{"x": torch.arange(i), "s": "ab" * i, "b": bytes([i])} for i in range(20)]
    rf = _push(tmp_path / "set.tr", samples, shuffle=False, schema={"x": [None]})
    assert rf.schema.fields[0].shape == (None,)
    for i, sample in enumerate(rf):
        assert torch.equal(sample["x"], torch.arange(i)) and sample["s"] == "ab" * i and sample["b"] == bytes([i])


def test_empty_writer_publishes_an_empty_set(tmp_path: Path) -> None:
    rf = _push(tmp_path / "set.tr", [])
    assert len(rf) == 0 and list(rf) == []


# -- abort, exceptions, errors in append --------------------------------------------------------------


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    with RecordWriter(path, progress=False) as w:
        for sample in _samples(20):
            w.append(sample)
        w.abort()
    assert w.result is None and entries(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        w.append(_samples(1)[0])
    with pytest.raises(ValueError, match="aborted"):
        w.close()


@pytest.mark.parametrize("shuffle", [False, True])
def test_abort_keeps_the_previous_set(tmp_path: Path, shuffle: bool) -> None:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(300), path, progress=False)
    w = RecordWriter(path, overwrite=True, shuffle=shuffle, progress=False, commit_bytes=4 << 10)
    source = Labelled(500, offset=1000)
    for i in range(500):
        w.append(source[i])
    w.abort()
    assert entries(tmp_path) == ["set.tr"]
    assert_is_set(path, 300, 0)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("error", [_Stop, KeyboardInterrupt])
@pytest.mark.parametrize("shuffle", [False, True])
def test_exception_in_the_block_leaves_nothing(tmp_path: Path, error: type[BaseException], shuffle: bool) -> None:
    path = tmp_path / "first.tr"
    with pytest.raises(error), RecordWriter(path, shuffle=shuffle, progress=False, commit_bytes=4 << 10) as w:
        for sample in _samples(400):
            w.append(sample)
        raise error()
    assert w.result is None and entries(tmp_path) == []


@pytest.mark.parametrize("shuffle", [False, True])
def test_exception_in_the_block_keeps_the_previous_set(tmp_path: Path, shuffle: bool) -> None:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(300), path, progress=False)
    writer = RecordWriter(path, overwrite=True, shuffle=shuffle, progress=False, commit_bytes=4 << 10)
    with pytest.raises(_Stop), writer as w:
        for i in range(400):
            w.append(Labelled(400, offset=1000)[i])
        raise _Stop
    assert entries(tmp_path) == ["set.tr"]
    assert_is_set(path, 300, 0)


def test_an_unstorable_sample_aborts_and_names_the_sample(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    message = r"set\.tr: sample 3, field '1': cannot store a leaf of type set"
    with pytest.raises(SampleTypeError, match=message) as info, RecordWriter(path, progress=False) as w:
        for i in range(10):
            w.append((torch.zeros(2), {1, 2}) if i == 3 else (torch.zeros(2), i))
    assert "on_error='skip'" in str(info.value)  # samples before it were good: skipping may be what is meant
    assert entries(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        w.append((torch.zeros(2), 0))


def test_a_sample_of_another_structure_aborts(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"sample 2"), RecordWriter(tmp_path / "set.tr", progress=False) as w:
        w.append((1, 2.0))
        w.append((3, 4.0))
        w.append((5, "six"))
    assert entries(tmp_path) == []


def test_skip_leaves_out_and_counts(tmp_path: Path) -> None:
    samples = [(torch.zeros(2), {1}) if i in (0, 4) else (torch.zeros(2), i) for i in range(10)]
    rf = _push(tmp_path / "set.tr", samples, on_error="skip", shuffle=False)
    assert rf.metadata["skipped"] == 2 and [s[1] for s in rf] == [1, 2, 3, 5, 6, 7, 8, 9]


def test_existing_target_and_bad_options(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(10), path, progress=False)
    with pytest.raises(RecordExistsError, match="overwrite=True"):
        RecordWriter(path)
    with pytest.raises(ValueError, match="on_error"):
        RecordWriter(tmp_path / "b.tr", on_error="ignore")
    with pytest.raises(ValueError, match="samples_per_record"):
        RecordWriter(tmp_path / "b.tr", samples_per_record=0)
    with pytest.raises(WriteError, match="parent directory"):
        RecordWriter(tmp_path / "missing" / "b.tr")
    assert entries(tmp_path) == ["set.tr"]


def test_a_dropped_writer_removes_its_files(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "set.tr", progress=False)
    for sample in _samples(20):
        w.append(sample)
    assert temporaries(tmp_path, "set.tr")
    del w
    gc.collect()
    assert entries(tmp_path) == []


# -- kills, a full disk, the growing map ------------------------------------------------------------


def _push_then_exit(path: str, n: int, shuffle: bool, kill_at: tuple[str, str, int]) -> None:
    """Child: push n Labelled samples (offset 10,000) over ``path``, SIGKILLing itself at ``kill_at``.

    ``kill_at`` = (event, name, nth) as in tests/write/test_reliability.py.
    """
    seen = 0

    def on_event(frame: Any, event: str, arg: Any) -> None:
        nonlocal seen
        if event != kill_at[0]:
            return
        name = frame.f_code.co_name if event == "call" else getattr(arg, "__qualname__", "")
        if event == "c_call" and name == "replace" and arg is not os.replace:
            return
        if name == kill_at[1]:
            seen += 1
            if seen == kill_at[2]:
                os.kill(os.getpid(), signal.SIGKILL)

    source = Labelled(n, offset=10_000)
    sys.setprofile(on_event)
    try:
        with RecordWriter(
            path, overwrite=True, shuffle=shuffle, progress=False, commit_bytes=16 << 10, samples_per_record=1
        ) as w:
            for i in range(n):
                w.append(source[i])
    finally:
        sys.setprofile(None)


#: (event, function, occurrence) for both modes, and for the shuffled mode only
WRITER_KILL_POINTS = {
    "first sample": ("call", "__getitem__", 1),
    "mid-stream": ("call", "__getitem__", 700),
    "before the 3rd commit": ("c_call", "Transaction.commit", 3),
    "before the metadata": ("call", "finish", 1),
    "before the rename": ("c_call", "replace", 1),
}
SHUFFLED_KILL_POINTS = {"spool replay": ("call", "progress_bar", 2)}


@pytest.mark.parametrize(
    ("shuffle", "point"),
    [(False, p) for p in WRITER_KILL_POINTS] + [(True, p) for p in {**WRITER_KILL_POINTS, **SHUFFLED_KILL_POINTS}],
)
@pytest.mark.parametrize("previous", [False, True])
def test_sigkill_mid_writer(tmp_path: Path, shuffle: bool, point: str, previous: bool) -> None:
    path = tmp_path / "set.tr"
    if previous:
        torchrecord.write_record(Labelled(300), path, progress=False)
    kill_at = {**WRITER_KILL_POINTS, **SHUFFLED_KILL_POINTS}[point]
    proc = FORK.Process(target=_push_then_exit, args=(str(path), 2000, shuffle, kill_at))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL, f"the kill did not land: exit code {proc.exitcode}"
    if previous:
        assert_is_set(path, 300, 0)  # untouched
    else:
        assert not path.exists()
    assert all(e == "set.tr" or e.startswith(".set.tr.tmp-") for e in os.listdir(tmp_path))
    # the next write succeeds and removes the dead writer's temporaries
    _push(path, [Labelled(300)[i] for i in range(300)], overwrite=True)
    assert_is_set(path, 300, 0)
    assert temporaries(tmp_path, "set.tr") == []


def _push_blobs(path: str, n: int, nbytes: int, shuffle: bool, map_size: int = 1 << 28) -> list[str]:
    source = Blobs(n, nbytes)
    with RecordWriter(
        path, overwrite=True, shuffle=shuffle, progress=False, initial_map_size=map_size, samples_per_record=1
    ) as w:
        for i in range(n):
            w.append(source[i])
    return entries(os.path.dirname(path))


@pytest.mark.parametrize("shuffle", [False, True])
def test_map_grows_through_the_writer(tmp_path: Path, shuffle: bool) -> None:
    path = tmp_path / "big.tr"
    _push_blobs(str(path), 100, 64 << 10, shuffle, map_size=64 << 10)
    assert os.path.getsize(path) > 6 << 20 and entries(tmp_path) == ["big.tr"]
    rf = RecordFile(path)
    assert len(rf) == 100
    for i in (0, 50, 99):
        data, label = rf[i]
        assert torch.equal(data, Blobs(100, 64 << 10)[label][0])
    assert torchrecord.verify(path).ok


def _check_failed(directory: Path, outcome: tuple[str, Any], words: tuple[str, ...]) -> None:
    path = directory / "set.tr"
    assert outcome[0] == "raised", f"the write did not raise: {outcome}"
    name, message = outcome[1]
    assert name == "WriteError", outcome
    assert str(path) in message and all(w in message for w in words), message
    assert entries(directory) == ["set.tr"]  # partial output (and spool) removed
    assert_is_set(path, 300, 0)


@pytest.mark.parametrize("shuffle", [False, True])
def test_disk_full_through_the_writer(tmp_path: Path, shuffle: bool) -> None:
    with small_tmpfs(tmp_path / "mnt", "2m") as mnt:
        path = mnt / "set.tr"
        torchrecord.write_record(Labelled(300), path, progress=False)
        outcome = in_child(_push_blobs, str(path), 200, 64 << 10, shuffle)  # ~13 MB into 2 MB
        _check_failed(mnt, outcome, ("full", "free"))


def _push_with_size_limit(path: str, shuffle: bool) -> list[str]:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return _push_blobs(path, 100, 64 << 10, shuffle)


@pytest.mark.parametrize("shuffle", [False, True])
def test_file_size_limit_through_the_writer(tmp_path: Path, shuffle: bool) -> None:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(300), path, progress=False)
    outcome = in_child(_push_with_size_limit, str(path), shuffle)
    _check_failed(tmp_path, outcome, ("ulimit -f",))


# -- identity ---------------------------------------------------------------------------------------


def test_every_write_gets_a_distinct_set_id(tmp_path: Path) -> None:
    a = torchrecord.write_record(Labelled(10), tmp_path / "a.tr", progress=False)
    b = torchrecord.write_record(Labelled(10), tmp_path / "b.tr", progress=False)
    c = _push(tmp_path / "c.tr", _samples(10))
    ids = [rf.set_id for rf in (a, b, c)]
    for set_id, rf in zip(ids, (a, b, c)):
        assert len(set_id) == 32 and int(set_id, 16) >= 0
        assert rf.metadata["set_id"] == set_id and RecordFile(rf.path).set_id == set_id
    assert len(set(ids)) == 3
    again = torchrecord.write_record(Labelled(10), tmp_path / "a.tr", overwrite=True, progress=False)
    assert again.set_id != ids[0]  # the same data written again is another set


def _without_set_id(source: Path, target: Path) -> bytes:
    """Copy ``source`` and rewrite its metadata without ``set_id`` by raw LMDB; returns the new raw metadata."""
    shutil.copy(source, target)
    env = lmdb.open(str(target), subdir=False, max_dbs=4, lock=False)
    try:
        meta_db = env.open_db(b"meta")
        with env.begin(write=True, db=meta_db) as txn:
            meta = torchrecord._store.format.unpack_metadata(bytes(txn.get(b"metadata")), str(target))
            del meta["set_id"]
            raw = torchrecord._store.format.pack_metadata(meta)
            txn.put(b"metadata", raw)
    finally:
        env.close()
    return raw


def test_a_set_without_set_id_gets_a_stable_stand_in(tmp_path: Path) -> None:
    torchrecord.write_record(Labelled(10), tmp_path / "new.tr", progress=False)
    raw = _without_set_id(tmp_path / "new.tr", tmp_path / "old.tr")
    first = RecordFile(tmp_path / "old.tr").set_id
    assert first == "legacy-" + hashlib.sha256(raw).hexdigest()[:32]
    assert RecordFile(tmp_path / "old.tr").set_id == first  # stable across openings
    shutil.copy(tmp_path / "old.tr", tmp_path / "copy.tr")
    assert RecordFile(tmp_path / "copy.tr").set_id == first  # a byte copy is the same set
    assert sorted(labels_of(tmp_path / "old.tr")) == list(range(10))
