"""A forked child never waits on a lock that a thread of its parent held at the fork.

A DataLoader worker forked while the parent iterates a MixedDataset (or reads with
read-ahead hints) inherits the parent's read-ahead objects with their locks in
whatever state the parent's threads left them. When the child collects such an
object and closes it, it must not wait for a thread that does not exist there.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable

import numpy as np
import pytest

from torchrecord import MixedDataset, RecordFile, write_record
from torchrecord._store import advise as _advise
from torchrecord._store.advise import Advisor

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _in_forked_child(fn: Callable[[], None], timeout: float = 60) -> int | None:
    """Run ``fn`` in a forked child; its exit code, or None if it was still running after ``timeout``."""
    child = multiprocessing.get_context("fork").Process(target=fn)
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return None
    return child.exitcode


@pytest.fixture(scope="module")
def mix_sets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("forksafe")
    paths = []
    for s, n in enumerate([300, 200, 100]):
        path = str(root / f"s{s}.tr")
        write_record([(np.full(8, s, np.int64), i) for i in range(n)], path, progress=False)
        paths.append(path)
    return paths


def test_a_child_closes_an_inherited_read_ahead_whose_lock_was_held(mix_sets: list[str]) -> None:
    ds = MixedDataset(mix_sets, batch_size=16, seed=1)
    it = iter(ds)
    next(it)  # the parent's read-ahead threads are running
    assert ds._live is not None
    reader = ds._live["mixer"].reader
    with reader._cv:  # as a parent reader thread holds it, at the moment of the fork

        def child() -> None:
            reader.close()  # what collecting the inherited iterator does
            total = sum(len(batch[1]) for batch in ds)  # and a fresh iteration works
            os._exit(0 if total == 600 else 3)

        code = _in_forked_child(child)
    assert code == 0, "the child hung on the parent's lock" if code is None else f"child exit code {code}"
    assert sum(len(batch[1]) for batch in it) == 600 - 16  # the parent's iteration is untouched


@pytest.mark.skipif(not _advise.available(), reason="read-ahead hints need Linux")
def test_a_child_closes_an_inherited_advisor_whose_queue_lock_was_held(mix_sets: list[str]) -> None:
    rf = RecordFile(mix_sets[0])
    env, db = rf.environment()
    advisor = Advisor(env, db, mix_sets[0], 4096)
    try:
        with advisor._jobs.mutex:  # as the advisor thread holds it, at the moment of the fork

            def child() -> None:
                advisor.close()
                os._exit(0)

            code = _in_forked_child(child)
        assert code == 0, "the child hung on the parent's queue lock" if code is None else f"exit code {code}"
    finally:
        advisor.close()


def test_a_fork_waits_for_lmdb_calls_in_flight_on_other_threads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """py-lmdb waits, when an environment is closed, for the calls in flight on it: one that another
    thread was inside at the fork never ends in the child. A fork waits until no background thread is
    inside ``lmdb_calls()`` (before the gate: the child hung in ``env.close()``)."""
    import threading

    import lmdb

    from torchrecord._store.forkgate import lmdb_calls

    env = lmdb.open(str(tmp_path / "busy"), map_size=1 << 24)
    holding, release, inside = threading.Event(), threading.Event(), threading.Event()

    def hold_the_write_lock() -> None:
        txn = env.begin(write=True)
        holding.set()
        release.wait()
        txn.abort()

    def read_in_the_background() -> None:  # in flight in py-lmdb (GIL released) until the holder lets go
        with lmdb_calls():
            inside.set()
            env.begin(write=True).abort()

    threading.Thread(target=hold_the_write_lock, daemon=True).start()
    assert holding.wait(10)
    reader = threading.Thread(target=read_in_the_background, daemon=True)
    reader.start()
    assert inside.wait(10)
    threading.Timer(0.5, release.set).start()  # the fork below waits for this

    def child() -> None:
        env.close()  # what the child's registry does with the environments it inherited
        os._exit(0)

    try:
        assert _in_forked_child(child, timeout=30) == 0
        assert release.is_set()  # the fork happened after the region ended
    finally:
        release.set()
        reader.join(10)
        env.close()


def test_mixed_dataset_reads_start_no_advisor_threads(mix_sets: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-ahead thread's read must not wait for another thread of its own: a fork waits for the
    read, and that thread (the read's cold-read advisor) waited for the fork (the suite deadlocked)."""
    started: list[str] = []
    real = Advisor.__init__

    def counting(self: Advisor, *args: object, **kwargs: object) -> None:
        started.append(str(args[2]) if len(args) > 2 else "?")
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Advisor, "__init__", counting)
    total = sum(len(batch[1]) for batch in MixedDataset(mix_sets, batch_size=16, seed=1))
    assert total == 600
    assert started == []
