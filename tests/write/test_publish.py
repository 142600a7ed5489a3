"""Publishing a record set: no-replace, the returned RecordFile's identity, stale temporaries.

* ``overwrite=False`` is an atomic no-replace: of several writer processes racing
  to create one absent path exactly one wins, the others get RecordExistsError,
  and nothing half-written is left (renameat2(RENAME_NOREPLACE), and the hard
  link fallback).
* The RecordFile a writer returns reads that writer's set, or raises
  RecordReplacedError: never another writer's set.
* Stale temporaries are recognised by the lock their live writer holds, not by
  a PID: a live writer whose PID means nothing here keeps its files; a killed
  writer's files are removed by the next write.

Real files and real processes throughout.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import torchrecord
from tests.write.test_reliability import FORK, Labelled, LabelledStream, assert_is_set
from torchrecord._write import publish as _publish
from torchrecord.errors import RecordExistsError, RecordReplacedError, WriteError


def _labels(rf: torchrecord.RecordFile) -> list[int]:
    return sorted(int(label) for _, label in rf)


def _dead_pid() -> int:
    """A PID that no process of this machine has (its process has exited)."""
    proc = FORK.Process(target=os.getpid)
    proc.start()
    proc.join()
    assert proc.pid is not None
    return proc.pid


# -- overwrite=False: atomic no-replace ----------------------------------------------------------


def _race_to_create(path: str, offset: int, barrier: Any, stream: bool, out: Any) -> None:
    """Child: wait for the others, then write a set of 200 labels from ``offset`` to ``path``."""
    source = LabelledStream(200, offset) if stream else Labelled(200, offset)
    barrier.wait(60)
    try:
        rf = torchrecord.write_record(source, path, progress=False)
        out.put((offset, "won", _labels(rf)))
    except RecordExistsError as exc:
        out.put((offset, "exists", str(exc)))
    except BaseException as exc:
        out.put((offset, "other", f"{type(exc).__name__}: {exc}"))


def _race(tmp_path: Path, rounds: int, writers: int, stream: bool = False) -> int:
    """``rounds`` races of ``writers`` processes on fresh paths; returns how many losers passed the early check."""
    contested = 0
    for r in range(rounds):
        path = str(tmp_path / f"set{r}.tr")
        barrier, out = FORK.Barrier(writers), FORK.Queue()
        procs = [
            FORK.Process(target=_race_to_create, args=(path, 1000 * (w + 1), barrier, stream, out))
            for w in range(writers)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        winners = [(offset, labels) for offset, what, labels in results if what == "won"]
        others = [r for r in results if r[1] != "won"]
        assert len(winners) == 1, f"round {r}: {len(winners)} writers published over each other: {results}"
        assert all(what == "exists" for _, what, _ in others), others
        offset, labels = winners[0]
        assert labels == list(range(offset, offset + 200))  # the winner's RecordFile reads its own set
        assert_is_set(path, 200, offset)  # and that is what the path holds
        assert sorted(os.listdir(tmp_path)) == sorted(f"set{i}.tr" for i in range(r + 1))  # nothing half-written
        contested += sum("while this one was writing" in str(msg) for _, what, msg in others)
    return contested


def test_racing_writers_on_an_absent_path_exactly_one_wins(tmp_path: Path) -> None:
    contested = _race(tmp_path, rounds=6, writers=4)
    assert contested > 0  # the losers got past the early check: the publish itself refused them


def test_racing_spooled_writers_exactly_one_wins(tmp_path: Path) -> None:
    _race(tmp_path, rounds=3, writers=3, stream=True)


def test_racing_writers_with_the_hard_link_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2 is not available the move is link(2) + unlink: still exactly one winner."""
    monkeypatch.setattr(_publish, "_renameat2_fn", False)  # the forked writers inherit it
    contested = _race(tmp_path, rounds=4, writers=4)
    assert contested > 0


def test_the_losing_publish_leaves_the_winner_and_no_file(tmp_path: Path) -> None:
    """A writer that finds the target created after its check raises and removes all its files."""
    path = tmp_path / "set.tr"
    writer = torchrecord.RecordWriter(path, shuffle=True)
    for i in range(50):
        writer.append({"x": i})
    torchrecord.write_record(Labelled(30), path, progress=False)  # another writer wins meanwhile
    with pytest.raises(RecordExistsError, match="another writer published"):
        writer.close()
    assert os.listdir(tmp_path) == ["set.tr"]
    assert_is_set(path, 30, 0)


def test_no_hard_links_and_no_renameat2_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system with neither, overwrite=False fails clearly and leaves nothing."""

    def no_links(src: Any, dst: Any, **kw: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(src))

    monkeypatch.setattr(_publish, "_renameat2_fn", False)
    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(WriteError, match=r"neither renameat2.*nor hard links.*overwrite=True"):
        torchrecord.write_record(Labelled(20), tmp_path / "set.tr", progress=False)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    torchrecord.write_record(Labelled(20), tmp_path / "set.tr", overwrite=True, progress=False)  # replace works


# -- the RecordFile a writer returns ---------------------------------------------------------------


def test_returned_recordfile_never_reads_a_set_written_after_it(tmp_path: Path) -> None:
    """Replaced right after its write (before its first use): RecordReplacedError, not the other set."""
    path = tmp_path / "set.tr"
    mine = torchrecord.write_record(Labelled(40, offset=0), path, progress=False)
    torchrecord.write_record(Labelled(25, offset=5000), path, overwrite=True, progress=False)
    with pytest.raises(RecordReplacedError, match="holds another record set now") as info:
        len(mine)
    assert isinstance(info.value, FileNotFoundError)
    assert sorted(int(label) for _, label in torchrecord.RecordFile(path)) == list(range(5000, 5025))


def test_an_opened_recordfile_keeps_its_set_across_close_and_pickle(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    rf = torchrecord.write_record(Labelled(40), path, progress=False)
    assert _labels(rf) == list(range(40))
    copy = pickle.dumps(rf)
    torchrecord.write_record(Labelled(25, offset=5000), path, overwrite=True, progress=False)
    assert _labels(rf) == list(range(40))  # still open: its snapshot
    rf.close()
    with pytest.raises(RecordReplacedError):
        rf[0]  # re-opened after close: the path holds another set now
    with pytest.raises(RecordReplacedError):
        len(pickle.loads(copy))
    with pytest.raises(RecordReplacedError):
        torchrecord.RecordDataset(pickle.loads(copy))
    fresh = torchrecord.RecordFile(path)
    assert _labels(fresh) == list(range(5000, 5025))


def _rewrite_and_read(path: str, offset: int, rounds: int, barrier: Any, out: Any) -> None:
    """Child: ``rounds`` times, replace ``path`` with this writer's set and read the returned RecordFile."""
    outcomes = {"own": 0, "replaced": 0}
    try:
        for _ in range(rounds):
            barrier.wait(60)
            rf = torchrecord.write_record(Labelled(60, offset), path, overwrite=True, progress=False)
            try:
                labels = _labels(rf)
            except RecordReplacedError:
                outcomes["replaced"] += 1
                continue
            assert labels == list(range(offset, offset + 60)), f"writer {offset} read another set: {labels[:3]}"
            outcomes["own"] += 1
        out.put((offset, "ok", outcomes))
    except BaseException as exc:
        barrier.abort()
        out.put((offset, "failed", f"{type(exc).__name__}: {exc}"))


def test_two_racing_overwriters_each_read_their_own_set(tmp_path: Path) -> None:
    path = str(tmp_path / "set.tr")
    barrier, out = FORK.Barrier(2), FORK.Queue()
    procs = [FORK.Process(target=_rewrite_and_read, args=(path, o, 25, barrier, out)) for o in (10_000, 20_000)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(what == "ok" for _, what, _ in results), results
    total = {k: sum(r[2][k] for r in results) for k in ("own", "replaced")}
    assert total["own"] + total["replaced"] == 50 and total["own"] > 0, total
    assert sorted(os.listdir(tmp_path)) == ["set.tr"]


# -- stale temporaries: a lock, not a PID -----------------------------------------------------------


def _hold(lock: str, ready: Any, done: Any) -> None:
    """Child: hold an exclusive flock on ``lock`` (a writer in another PID namespace, say) until ``done``."""
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    done.wait(120)
    os.close(fd)


def _fake_write(directory: Path, pid: int, token: str, locked_by: str = "") -> list[Path]:
    """The files of a write in progress: a temporary, a spool and a lock file naming ``pid``."""
    base = directory / f".set.tr.tmp-{pid}-{token}"
    files = [base, Path(f"{base}.spool"), Path(f"{base}{_publish.LOCK_SUFFIX}")]
    files[0].write_bytes(b"records so far")
    files[1].write_bytes(b"spooled samples")
    files[2].write_text(locked_by or f"{pid} otherhost\n")
    return files


def test_a_live_writer_whose_pid_looks_dead_keeps_its_temporaries(tmp_path: Path) -> None:
    files = _fake_write(tmp_path, _dead_pid(), "0123abcd")
    ready, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(files[2]), ready, done))
    holder.start()
    try:
        assert ready.wait(60)
        torchrecord.write_record(Labelled(10), tmp_path / "set.tr", progress=False)
        torchrecord.write_record(Labelled(10), tmp_path / "set.tr", overwrite=True, progress=False)
        with torchrecord.RecordWriter(tmp_path / "set.tr", overwrite=True) as w:
            w.append({"x": 1})
        assert all(f.exists() for f in files), sorted(os.listdir(tmp_path))
    finally:
        done.set()
        holder.join(60)
    torchrecord.write_record(Labelled(10), tmp_path / "set.tr", overwrite=True, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["set.tr"]  # its writer gone: the lock is free, the files stale


def test_an_unlocked_write_is_stale_whatever_its_pid(tmp_path: Path) -> None:
    """A lock file nobody holds marks a dead write even if its PID now names a live process (reused PID)."""
    files = _fake_write(tmp_path, os.getpid(), "89abcdef")
    torchrecord.write_record(Labelled(10), tmp_path / "set.tr", progress=False)
    assert not any(f.exists() for f in files)
    assert sorted(os.listdir(tmp_path)) == ["set.tr"]


def test_a_just_created_empty_lock_file_is_left_alone(tmp_path: Path) -> None:
    """An empty, unlocked lock file may be one a writer created and is about to lock: left (for an hour)."""
    files = _fake_write(tmp_path, _dead_pid(), "00ff00ff", locked_by="")
    files[2].write_bytes(b"")
    torchrecord.write_record(Labelled(10), tmp_path / "set.tr", progress=False)
    assert all(f.exists() for f in files)
    old = time.time() - 2 * 3600
    os.utime(files[2], (old, old))
    torchrecord.write_record(Labelled(10), tmp_path / "set.tr", overwrite=True, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["set.tr"]


def _writer_then_wait(path: str, started: Any) -> None:
    """Child: a RecordWriter with samples appended (temporary, spool and lock on disk), then sleep."""
    writer = torchrecord.RecordWriter(path, overwrite=True, shuffle=True, commit_bytes=1 << 10)
    for i in range(200):
        writer.append({"x": i})
    started.set()
    time.sleep(120)


def test_a_killed_writers_files_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "set.tr")
    started_a, started_b = FORK.Event(), FORK.Event()
    live = FORK.Process(target=_writer_then_wait, args=(path, started_a))
    killed = FORK.Process(target=_writer_then_wait, args=(path, started_b))
    live.start()
    killed.start()
    try:
        assert started_a.wait(60) and started_b.wait(60)
        assert killed.pid is not None and live.pid is not None
        os.kill(killed.pid, signal.SIGKILL)
        killed.join(60)
        names = sorted(os.listdir(tmp_path))
        mine = [n for n in names if f".tmp-{killed.pid}-" in n]
        theirs = [n for n in names if f".tmp-{live.pid}-" in n]
        assert any(n.endswith(".lock") for n in mine) and any(n.endswith(".spool") for n in mine), names
        torchrecord.write_record(Labelled(10), path, overwrite=True, progress=False)
        after = sorted(os.listdir(tmp_path))
        assert not any(n in after for n in mine), after  # the dead writer's files: gone
        assert all(n in after for n in theirs), after  # the live writer's: untouched
    finally:
        live.kill()
        live.join(60)


def test_a_writer_with_dataloader_workers_killed_leaves_no_live_lock(tmp_path: Path) -> None:
    """The lock lives as long as the writer: its forked reader workers do not keep it."""
    path = str(tmp_path / "set.tr")
    started = FORK.Event()

    def write_slowly() -> None:
        class Slow(Labelled):
            def __getitem__(self, i: int) -> Any:
                if i == 50:
                    started.set()
                if i >= 50:
                    time.sleep(0.05)
                return super().__getitem__(i)

        torchrecord.write_record(Slow(2000), path, num_workers=2, shuffle=False, progress=False)

    writer = FORK.Process(target=write_slowly)
    writer.start()
    assert started.wait(120)
    assert writer.pid is not None
    workers = _children(writer.pid)
    assert workers  # the DataLoader's workers, still alive below
    os.kill(writer.pid, signal.SIGKILL)
    # wait for the writer's death without reaping it: writer.join() would wait on a sentinel pipe
    # that the still-living workers inherited (until they die)
    os.waitid(os.P_PID, writer.pid, os.WEXITED | os.WNOWAIT)
    try:
        lock = [n for n in os.listdir(tmp_path) if n.endswith(_publish.LOCK_SUFFIX)]
        assert lock
        fd = os.open(tmp_path / lock[0], os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free at once, workers or not
        finally:
            os.close(fd)
    finally:
        # an orphaned DataLoader worker can wait forever at exit (its queue's feeder thread
        # blocks on a full pipe nobody reads), holding the test run's output open
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        writer.join(60)
    torchrecord.write_record(Labelled(10), path, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["set.tr"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found
