"""Many concurrent readers, and read-only files, directories and file systems.

torchrecord opens record sets with ``lock=False``: there is no LMDB reader table
to fill (MDB_READERS_FULL, 126 slots by default) and no lock file to create, so
any number of processes can read one set at once, from read-only places too.
Root bypasses permission bits, so read-only is also shown with a read-only bind
mount, a read-only tmpfs, and a reader that drops to the ``nobody`` user.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import torchrecord
from tests.helpers import assert_exactly_once
from tests.write.test_reliability import FORK, Labelled, in_child, readonly_bind, report_line, small_tmpfs

_READERS = {"processes": 0}


@pytest.fixture(scope="module", autouse=True)
def _report_readers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if _READERS["processes"]:
        report_line(request, f"many readers: {_READERS['processes']} reader processes ran")


def write(path: Path, n: int) -> Path:
    torchrecord.write_record(Labelled(n), path, progress=False)
    return path


def check_sample(image: Any, label: int) -> int:
    assert int(image.flatten()[0]) == label % 251 and bool((image == label % 251).all())
    return int(label)


# -- 64 processes at once -----------------------------------------------------------------------


def _shard_reader(path: str, rank: int, world: int, barrier: Any, results: Any) -> None:
    dataset = torchrecord.RecordDataset(path, rank=rank, world_size=world, seed=3)
    samples = iter(dataset)
    image, label = next(samples)
    labels = [check_sample(image, label)]
    barrier.wait(120)  # every reader has the file open and a read transaction live at this point
    labels += [check_sample(image, label) for image, label in samples]
    results.put((rank, labels))


def _many_processes(path: Path, count: int, readers: int) -> None:
    barrier = FORK.Barrier(readers)
    results = FORK.SimpleQueue()
    args = [(str(path), rank, readers, barrier, results) for rank in range(readers)]
    procs = [FORK.Process(target=_shard_reader, args=a) for a in args]
    for p in procs:
        p.start()
    seen: dict[int, list[int]] = dict(results.get() for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    _READERS["processes"] += readers
    assert sorted(seen) == list(range(readers))
    assert all(len(labels) == count // readers for labels in seen.values())
    assert_exactly_once(itertools.chain.from_iterable(seen.values()), count)
    assert os.listdir(path.parent) == [path.name]  # no lock file was created


def test_64_reader_processes_at_once(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", 640)
    _many_processes(path, 640, 64)


@pytest.mark.slow
def test_200_reader_processes_at_once_more_than_an_lmdb_reader_table(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", 20_000)
    _many_processes(path, 20_000, 200)


def _dataloaders(path: Path, count: int, loaders: int, workers: int, context: str) -> None:
    dataloaders = [
        DataLoader(
            torchrecord.RecordDataset(path, rank=r, world_size=loaders, batch_size=8, seed=5),
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=context,
        )
        for r in range(loaders)
    ]
    labels: list[int] = []
    iterators = [iter(loader) for loader in dataloaders]  # all loaders x workers processes run at once
    for batch in itertools.chain.from_iterable(itertools.zip_longest(*iterators)):
        if batch is not None:
            images, batch_labels = batch
            labels += [check_sample(x, int(y)) for x, y in zip(images, batch_labels, strict=True)]
    _READERS["processes"] += loaders * workers
    assert_exactly_once(labels, count)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_8_dataloaders_of_8_workers(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", 640)
    _dataloaders(path, 640, 8, 8, "fork")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_8_dataloaders_of_8_spawn_workers(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", 50_000)
    _dataloaders(path, 50_000, 8, 8, "spawn")


def test_more_open_transactions_than_an_lmdb_reader_table(tmp_path: Path) -> None:
    """300 readers mid-iteration in one process (126 would fill a locked environment's table)."""
    path = write(tmp_path / "set.tr", 50)
    readers: list[Iterator[Any]] = []
    for i in range(300):
        reader = iter(torchrecord.RecordFile(path)) if i % 2 else iter(torchrecord.RecordDataset(path))
        check_sample(*next(reader))
        readers.append(reader)
    for reader in readers:
        assert len([check_sample(*s) for s in reader]) == 49


# -- read-only -----------------------------------------------------------------------------------


def read_all(path: str, workers: int = 2) -> int:
    """Read the set every way, with DataLoader workers too; returns the number of samples."""
    rf = torchrecord.RecordFile(path)
    assert torchrecord.verify(path).ok
    labels = [check_sample(image, label) for image, label in rf]
    loader = DataLoader(torchrecord.RecordDataset(path, batch_size=16), batch_size=None, num_workers=workers)
    streamed = [int(x) for _, batch in loader for x in batch]
    assert sorted(labels) == sorted(streamed) == list(range(len(rf)))
    return len(labels)


def test_read_only_file_in_read_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = write(directory / "set.tr", 300)
    os.chmod(path, 0o444)
    os.chmod(directory, 0o555)
    try:
        assert read_all(str(path)) == 300
        assert os.listdir(directory) == ["set.tr"]
    finally:
        os.chmod(directory, 0o755)


def _as_nobody(path: str) -> tuple[int, str]:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    try:  # the permission bits really apply to this process
        open(os.path.join(os.path.dirname(path), "probe"), "w").close()
        denied = "no"
    except PermissionError:
        denied = "yes"
    # no DataLoader workers here: torch passes worker tensors through a socket in a
    # multiprocessing temp directory that root may already have created (mode 0700)
    return read_all(path, workers=0), denied


def test_read_only_for_an_unprivileged_reader() -> None:
    """A reader that is not root reads a 0444 file in a 0555 directory it cannot write to."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="torchrecord-ro-"))
    try:
        path = write(directory / "set.tr", 300)
        os.chmod(path, 0o444)
        os.chmod(directory, 0o555)
        kind, result = in_child(_as_nobody, str(path))
        assert (kind, result) == ("ok", (300, "yes"))
        assert os.listdir(directory) == ["set.tr"]
    finally:
        os.chmod(directory, stat.S_IRWXU)
        shutil.rmtree(directory)


def test_read_only_bind_mount(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    write(source / "set.tr", 300)
    with readonly_bind(source, tmp_path / "ro") as ro:
        with pytest.raises(OSError, match="Read-only file system"):
            open(ro / "probe", "w").close()
        kind, result = in_child(read_all, str(ro / "set.tr"))
        assert (kind, result) == ("ok", 300)


def test_read_only_tmpfs(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "8m") as mnt:
        write(mnt / "set.tr", 300)
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        kind, result = in_child(read_all, str(mnt / "set.tr"))
        assert (kind, result) == ("ok", 300)
        assert os.listdir(mnt) == ["set.tr"]
