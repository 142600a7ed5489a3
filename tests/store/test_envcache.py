"""Descriptors and mappings: what a reader holds, and for how long.

* ``RecordFile.close()`` and leaving ``with RecordFile(...)`` release the file's
  descriptor and mapping (read from /proc/self/fd and /proc/self/maps).
* The per-process environment cache is bounded: opening 2,000 sets one after
  another (each closed or dropped) keeps descriptors and mappings bounded, and
  so does running a RecordDataset over many sets.
* A file some reader still uses is never closed under it (snapshots stay).
* Running out of descriptors is a TooManyOpenFilesError saying so, never a
  NotARecordSetError blaming a good file.
"""

from __future__ import annotations

import errno
import gc
import os
import resource
import shutil
import sys
from pathlib import Path

import pytest

import torchrecord
from tests.write.test_reliability import Labelled, in_child
from torchrecord._store import envcache as _envcache
from torchrecord.errors import NotARecordSetError, TooManyOpenFilesError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def descriptors_of(path: str | os.PathLike[str]) -> int:
    """Descriptors of this process open on ``path`` (also once it was unlinked)."""
    target, count = os.path.abspath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += link == target or link == f"{target} (deleted)"
    return count


def mappings_of(path: str | os.PathLike[str]) -> int:
    """Mappings of ``path`` in this process's address space."""
    target = os.path.abspath(path)
    with open("/proc/self/maps") as f:
        return sum(line.rstrip("\n").split(None, 5)[-1] in (target, f"{target} (deleted)") for line in f)


def total_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def one_set(tmp_path: Path) -> Path:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(50), path, progress=False)
    return path


def copies(tmp_path: Path, source: Path, n: int) -> list[Path]:
    """``n`` copies of one record set (distinct files: distinct environments)."""
    folder = tmp_path / "copies"
    folder.mkdir()
    out = []
    for i in range(n):
        out.append(folder / f"c{i}.tr")
        shutil.copyfile(source, out[-1])
    return out


# -- close and with -----------------------------------------------------------------------------------


def test_close_releases_the_descriptor_and_the_mapping(one_set: Path) -> None:
    rf = torchrecord.RecordFile(one_set)
    assert int(rf[3][1]) in range(50)
    assert descriptors_of(one_set) == 1 and mappings_of(one_set) >= 1
    rf.close()
    assert descriptors_of(one_set) == 0 and mappings_of(one_set) == 0
    assert len(rf) == 50  # usable again: it re-opens on next use
    rf.close()
    assert descriptors_of(one_set) == 0


def test_a_with_block_releases_the_descriptor_and_the_mapping(one_set: Path) -> None:
    with torchrecord.RecordFile(one_set) as rf:
        labels = sorted(int(label) for _, label in rf)
        assert descriptors_of(one_set) == 1
    assert labels == list(range(50))
    assert descriptors_of(one_set) == 0 and mappings_of(one_set) == 0


def test_close_keeps_the_file_open_for_other_readers(one_set: Path) -> None:
    a, b = torchrecord.RecordFile(one_set), torchrecord.RecordFile(one_set)
    assert len(a) == len(b) == 50
    assert descriptors_of(one_set) == 1  # one environment per file per process
    a.close()
    assert descriptors_of(one_set) == 1 and int(b[49][1]) in range(50)
    b.close()
    assert descriptors_of(one_set) == 0


def test_close_during_an_iteration_lets_it_finish(one_set: Path) -> None:
    rf = torchrecord.RecordFile(one_set)
    it = iter(rf)
    first = [int(next(it)[1]) for _ in range(10)]
    rf.close()
    rest = [int(label) for _, label in it]  # the iteration's transaction keeps the file open
    assert sorted(first + rest) == list(range(50))
    del it
    assert descriptors_of(one_set) == 0 and mappings_of(one_set) == 0


def test_a_dropped_recordfile_stays_in_the_small_idle_cache(one_set: Path) -> None:
    rf = torchrecord.RecordFile(one_set)
    len(rf)
    del rf
    gc.collect()
    assert descriptors_of(one_set) == 1  # idle, for the next reader of the file
    again = torchrecord.RecordFile(one_set)
    assert len(again) == 50 and descriptors_of(one_set) == 1
    again.close()
    assert descriptors_of(one_set) == 0


# -- bounded -------------------------------------------------------------------------------------------


# closed explicitly is the easy case (about 16 s): --runslow; dropped, which the cache must handle, always runs
@pytest.mark.parametrize("how", [pytest.param("closed", marks=pytest.mark.slow), "dropped"])
def test_opening_2000_sets_one_after_another_keeps_descriptors_bounded(tmp_path: Path, one_set: Path, how: str) -> None:
    paths = copies(tmp_path, one_set, 2000)
    before = total_descriptors()
    for path in paths:
        rf = torchrecord.RecordFile(path)
        assert int(rf[0][1]) in range(50)
        if how == "closed":
            rf.close()
        del rf
    gc.collect()
    held = sum(descriptors_of(p) for p in paths)
    mapped = sum(mappings_of(p) for p in paths)
    limit = 0 if how == "closed" else _envcache.IDLE_LIMIT
    assert held <= limit and mapped <= limit, (held, mapped)
    assert total_descriptors() <= before + limit


def test_a_held_file_is_never_closed_by_the_cache(tmp_path: Path, one_set: Path) -> None:
    held = torchrecord.RecordFile(one_set)
    it = iter(held)
    next(it)
    for path in copies(tmp_path, one_set, 3 * _envcache.IDLE_LIMIT):
        len(torchrecord.RecordFile(path))
    gc.collect()
    assert descriptors_of(one_set) == 1
    assert len(list(it)) == 49 and len(held) == 50 and int(held[10][1]) in range(50)


def test_recorddatasets_let_go_of_their_file_when_a_pass_ends(tmp_path: Path, one_set: Path) -> None:
    paths = copies(tmp_path, one_set, 3 * _envcache.IDLE_LIMIT)
    datasets = [torchrecord.RecordDataset(p, shuffle=False) for p in paths]  # all kept alive
    for ds in datasets:
        assert sorted(int(label) for _, label in ds) == list(range(50))
    for ds in datasets[:5]:  # a second pass works (from the idle cache, or opening again)
        assert len(list(ds)) == 50
    gc.collect()
    assert sum(descriptors_of(p) for p in paths) <= _envcache.IDLE_LIMIT


def test_a_finished_pass_keeps_its_snapshot_while_the_file_is_cached(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    torchrecord.write_record(Labelled(40), path, progress=False)
    ds = torchrecord.RecordDataset(path, shuffle=False)
    assert len(list(ds)) == 40
    torchrecord.write_record(Labelled(30, offset=900), path, overwrite=True, progress=False)
    assert sorted(int(label) for _, label in ds) == list(range(40))  # the same set again, not a mix


# -- out of descriptors -------------------------------------------------------------------------------


def _open_until_exhausted(paths: list[str], headroom: int) -> tuple[str, str, int]:
    """Child: lower the descriptor limit, then hold sets open until it runs out."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (total_descriptors() + headroom, hard))
    held = []
    for path in paths:
        rf = torchrecord.RecordFile(path)
        try:
            len(rf)
        except Exception as exc:
            return type(exc).__name__, str(exc), getattr(exc, "errno", None) or 0
        held.append(rf)
    return "none", "", len(held)


def test_running_out_of_descriptors_is_reported_as_such(tmp_path: Path, one_set: Path) -> None:
    paths = [str(p) for p in copies(tmp_path, one_set, 200)]
    outcome = in_child(_open_until_exhausted, paths, 60)
    assert outcome[0] == "ok", outcome
    name, message, err = outcome[1]
    assert name == "TooManyOpenFilesError", outcome
    assert err == errno.EMFILE and "too many open files" in message and "ulimit -n" in message
    assert "copy it again" not in message
    assert issubclass(TooManyOpenFilesError, OSError) and not issubclass(TooManyOpenFilesError, NotARecordSetError)


def _open_and_drop(paths: list[str], headroom: int) -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (total_descriptors() + headroom, hard))
    for path in paths:
        assert len(torchrecord.RecordFile(path)) == 50
    return len(paths)


def test_dropped_readers_never_run_out_of_descriptors(tmp_path: Path, one_set: Path) -> None:
    """Under a limit smaller than the sets opened (but above the idle cache), dropped readers never fail."""
    paths = [str(p) for p in copies(tmp_path, one_set, 300)]
    assert in_child(_open_and_drop, paths, _envcache.IDLE_LIMIT + 16) == ("ok", 300)


def test_idle_files_are_given_back_when_descriptors_run_out(tmp_path: Path, one_set: Path) -> None:
    """Under a limit below the idle cache's size, the idle files are closed to make room."""
    paths = [str(p) for p in copies(tmp_path, one_set, 100)]
    assert in_child(_open_and_drop, paths, _envcache.IDLE_LIMIT // 2) == ("ok", 100)


def test_a_reader_in_a_forked_child_does_not_touch_the_parents_files(one_set: Path) -> None:
    rf = torchrecord.RecordFile(one_set)
    len(rf)

    def child() -> int:
        rf.close()  # the inherited handle: given back in the child only
        return len(torchrecord.RecordFile(one_set))

    assert in_child(child) == ("ok", 50)
    assert descriptors_of(one_set) == 1 and int(rf[0][1]) in range(50)
    rf.close()
    assert descriptors_of(one_set) == 0
