"""Reading guarantees, shown on real damaged files.

* No code execution: a pickle payload planted in a record or in the metadata is
  refused as a FormatError and never run; no read path can unpickle.
* Integrity: ``verify`` finds bytes flipped inside the data file and records
  rewritten with raw LMDB, naming the first bad index and counting the bad ones;
  ``RecordDataset(check="checksums")`` stops at the first bad record.
* Damaged files (truncated, empty, not LMDB, no metadata, newer format,
  unfinished) raise a torchrecord error naming the path and saying what to do,
  never SIGBUS or a raw LMDB/struct error.
* A record set rewritten at the same path while a reader is open: the old
  reader keeps reading its complete snapshot, never a mix.

Files are damaged before torchrecord opens them in this process (py-lmdb opens a
file once per process), or by another process. Reads that a regression could turn
into a crash run in a forked child (``in_child``), so the test fails instead of
pytest dying.
"""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest
from torch.utils.data import DataLoader

import torchrecord
from tests.write.test_reliability import FORK, Labelled, assert_is_set, in_child, labels_of
from torchrecord._core.codec import encode_payloads
from torchrecord._store import format as _format
from torchrecord._write.sources import normalize
from torchrecord.errors import (
    ChecksumError,
    CorruptRecordError,
    FormatError,
    IncompleteRecordSetError,
    NotARecordSetError,
    RecordNotFoundError,
    StructureError,
    VersionError,
)

PACKAGE = Path(torchrecord.__file__).parent


def write(path: Path, n: int = 64, offset: int = 0, **kwargs: Any) -> Path:
    kwargs.setdefault("shuffle", False)
    kwargs.setdefault("samples_per_record", 1)  # these tests damage record i to reach sample i
    torchrecord.write_record(Labelled(n, offset), path, progress=False, **kwargs)
    return path


def raw_env(path: Path) -> lmdb.Environment:
    """Open a record set for raw writing (only before torchrecord opens it in this process), with room for a
    file over lmdb's default map size (10 MiB)."""
    room = max(10 << 20, 2 * path.stat().st_size) if path.exists() else 10 << 20
    return lmdb.open(str(path), subdir=False, lock=False, max_dbs=_format.MAX_DBS, map_size=room)


def put(path: Path, db: bytes, key: bytes, value: bytes | None) -> None:
    """Put (or delete, for None) one raw key in one named database of the file."""
    env = raw_env(path)
    try:
        handle = env.open_db(db)
        with env.begin(write=True) as txn:
            if value is None:
                txn.delete(key, db=handle)
            else:
                txn.put(key, value, db=handle)
    finally:
        env.close()


def encoded(label: int) -> bytes:
    """The exact bytes write_record stores for the Labelled sample with this label."""
    norm = normalize(Labelled(1, offset=label)[0])
    return encode_payloads(norm.payloads, norm.signatures)


def read_everything(path: Path) -> list[tuple[str, str, str]]:
    """Every way to read a record set; returns (way, error type, message) for each that raised."""
    ways: dict[str, Callable[[], Any]] = {
        "RecordFile[i]": lambda: [rf[i] for rf in [torchrecord.RecordFile(path)] for i in range(len(rf))],
        "RecordFile iteration": lambda: list(torchrecord.RecordFile(path)),
        "RecordDataset": lambda: list(torchrecord.RecordDataset(path, shuffle=False)),
        "RecordDataset batches": lambda: list(torchrecord.RecordDataset(path, shuffle=False, batch_size=8)),
        "RecordDataset verify": lambda: list(torchrecord.RecordDataset(path, check="checksums", batch_size=8)),
    }
    raised = []
    for way, read in ways.items():
        try:
            read()
        except Exception as exc:
            raised.append((way, type(exc).__name__, str(exc)))
    return raised


# -- no code execution ---------------------------------------------------------------------------


class Payload:
    """The classic pickle exploit: unpickling calls os.mkdir(marker)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def payload(marker: Path, protocol: int) -> bytes:
    """A pickle that creates ``marker`` when loaded (checked: it really does)."""
    data = pickle.dumps(Payload(marker), protocol=protocol)
    pickle.loads(data)  # the control: this payload executes code when unpickled
    assert marker.is_dir()
    marker.rmdir()
    return data


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("update_crc", [False, True])
def test_pickle_in_a_record_is_refused_not_run(tmp_path: Path, protocol: int, update_crc: bool) -> None:
    marker = tmp_path / "pwned"
    path = write(tmp_path / "set.tr")
    evil = payload(marker, protocol)
    put(path, _format.RECORDS_DB, _format.encode_key(5), evil)
    if update_crc:  # so that only the decoder stands in the way
        put(path, _format.CRC_DB, _format.encode_key(5), zlib.crc32(evil).to_bytes(4, "little"))
    raised = read_everything(path)
    assert {way for way, _, _ in raised} == {
        "RecordFile[i]",
        "RecordFile iteration",
        "RecordDataset",
        "RecordDataset batches",
        "RecordDataset verify",
    }, raised
    for way, kind, message in raised:
        assert kind in ("CorruptRecordError", "ChecksumError"), (way, kind, message)
        assert str(path) in message and "record 5" in message, (way, message)
    report = torchrecord.verify(path)
    assert (report.bad, report.first_bad) == (1, 5)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_pickle_as_the_metadata_is_refused_not_run(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    path = write(tmp_path / "set.tr")
    put(path, _format.META_DB, _format.META_KEY, payload(marker, protocol))
    with pytest.raises(NotARecordSetError, match=str(path)):
        len(torchrecord.RecordFile(path))
    with pytest.raises(NotARecordSetError):
        torchrecord.verify(path)
    assert not marker.exists()


def test_pickle_bytes_inside_user_metadata_stay_bytes(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = payload(marker, 2)
    path = write(tmp_path / "set.tr", metadata={"blob": evil})
    assert torchrecord.RecordFile(path).user_metadata == {"blob": evil}
    assert not marker.exists()


def test_msgpack_extension_types_in_the_metadata_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr")
    meta = msgpack.unpackb(_read_meta(path))
    meta["user"] = {"x": msgpack.ExtType(1, b"\x80\x04K\x01.")}
    put(path, _format.META_DB, _format.META_KEY, msgpack.packb(meta, use_bin_type=True))
    with pytest.raises(NotARecordSetError, match="extension type 1 is not allowed"):
        len(torchrecord.RecordFile(path))


_UNSAFE_MODULES = {"pickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "yaml"}
_UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def test_no_unpickling_or_eval_anywhere_in_the_package() -> None:
    """No module imports pickle-like loaders or calls eval/exec; np.load always has allow_pickle=False."""
    problems = []
    for source in PACKAGE.rglob("*.py"):
        if source.name.endswith("_pb2.py"):
            continue
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            where = f"{source.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                problems += [f"{where} import {a.name}" for a in node.names if a.name in _UNSAFE_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _UNSAFE_MODULES:
                problems.append(f"{where} from {node.module} import")
            elif isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in _UNSAFE_CALLS or name in ("torch.load", "pickle.loads", "numpy.load"):
                    problems.append(f"{where} {name}()")
                if name in ("np.load", "numpy.load"):
                    flags = {k.arg: ast.unparse(k.value) for k in node.keywords}
                    if flags.get("allow_pickle") != "False":
                        problems.append(f"{where} np.load without allow_pickle=False")
    assert problems == []


# -- integrity: CRC-32 and verify ---------------------------------------------------------------------


def _occurrences(data: bytes | bytearray, value: bytes) -> list[int]:
    """Offsets of ``value`` in the file: the live record and any stale copy in a free page."""
    found, start = [], data.find(value)
    while start >= 0:
        found.append(start)
        start = data.find(value, start + 1)
    assert found, "the record's bytes are not in the file"
    return found


def _flip_in_file(path: Path, value: bytes, at: int) -> None:
    """Flip one bit of ``value``'s ``at``-th byte wherever the record's bytes sit in the data file."""
    data = bytearray(path.read_bytes())
    for start in _occurrences(data, value):
        data[start + at] ^= 0x10
    path.write_bytes(bytes(data))


def test_verify_finds_bytes_flipped_in_the_data_file(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=300, offset=1000)  # labels 1000.. keep every record unique
    bad = [7, 150, 299]
    for i in bad:
        value = encoded(1000 + i)
        _flip_in_file(path, value, len(value) // 2)  # inside the image's raw bytes: decodes fine
    report = torchrecord.verify(path)
    assert (report.records, report.bad, report.first_bad) == (300, 3, 7)
    assert [i for i, _ in report.errors] == bad
    assert all("CRC-32" in m and str(path) in m for _, m in report.errors)
    for loader in (
        torchrecord.RecordDataset(path, shuffle=False, check="checksums"),
        torchrecord.RecordDataset(path, shuffle=False, check="checksums", batch_size=16),
    ):
        with pytest.raises(ChecksumError, match=rf"{path}: record 7\b"):
            list(loader)


def test_check_checksums_catches_a_corrupted_crc_on_every_reader(tmp_path: Path) -> None:
    """check="checksums" (was verify=True) and "full" raise ChecksumError on a record whose bytes no longer
    match their CRC-32, on RecordFile and the readers; without a check the flipped bytes are read."""
    path = write(tmp_path / "set.tr", n=120, offset=1000)
    value = encoded(1000 + 33)
    _flip_in_file(path, value, len(value) // 2)  # inside the image's raw bytes: decodes fine
    assert len(list(torchrecord.RecordFile(path))) == 120  # trusted: read as it is
    readers: list[Callable[[str | None], Any]] = [
        lambda check: torchrecord.RecordFile(path, check=check)[33],
        lambda check: list(torchrecord.RecordFile(path, check=check)),
        lambda check: torchrecord.RecordFile(path, check=check)[30:40],
        lambda check: list(torchrecord.RecordDataset(path, check=check, batch_size=16)),
        lambda check: list(torchrecord.MixedDataset([path], check=check, batch_size=16)),
    ]
    for read in readers:
        read(None)
        for check in ("checksums", "full"):
            with pytest.raises(ChecksumError, match=rf"{path}: record 33\b"):
                read(check)


def test_verify_finds_a_flipped_header_byte(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=300, offset=1000)
    _flip_in_file(path, encoded(1010), 1)  # inside the protobuf framing
    report = torchrecord.verify(path)
    assert (report.bad, report.first_bad) == (1, 10)


def test_verify_finds_records_rewritten_with_raw_lmdb(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=100)
    other = encoded(7777)  # a valid record of another sample, CRC not updated
    put(path, _format.RECORDS_DB, _format.encode_key(40), other)
    garbage = b"\xff" * 12  # undecodable, with a matching CRC: only the decoder catches it
    put(path, _format.RECORDS_DB, _format.encode_key(60), garbage)
    put(path, _format.CRC_DB, _format.encode_key(60), zlib.crc32(garbage).to_bytes(4, "little"))
    put(path, _format.RECORDS_DB, _format.encode_key(80), None)  # deleted
    put(path, _format.RECORDS_DB, _format.encode_key(100), other)  # one beyond the count
    report = torchrecord.verify(path)
    assert report.first_bad == 40 and report.bad == 4
    messages = dict(report.errors)
    assert "CRC-32" in messages[40]
    assert "not a valid TensorProtos" in messages[60] or "fields stored" in messages[60]
    assert "missing" in messages[80]
    assert "beyond the count" in messages[100]


_REWRITE_IN_PLACE = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=False, max_dbs=4)
with env.begin(write=True, db=env.open_db(b"records")) as txn:
    key = (5).to_bytes(8, "big")
    txn.put(key, txn.get(key)[:-1] + b"\\x07")
env.close()
"""


def test_verify_sees_a_change_made_by_another_process_while_open(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=100, offset=500)
    assert torchrecord.verify(path).ok  # torchrecord now holds the file open in this process
    subprocess.run([sys.executable, "-c", _REWRITE_IN_PLACE, str(path)], check=True)
    report = torchrecord.verify(path)
    assert (report.bad, report.first_bad) == (1, 5)


def _zero_page_holding(path: Path, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    for start in _occurrences(data, value):
        page = start // 4096
        data[page * 4096 : (page + 1) * 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def _verify_error(path: str) -> str:
    try:
        torchrecord.verify(path)
    except StructureError as exc:
        return str(exc)
    return "no error"


def test_verify_survives_a_zeroed_lmdb_page(tmp_path: Path) -> None:
    """A damaged LMDB page (not just record bytes): verify names it as structural damage, never aborts."""
    path = write(tmp_path / "set.tr", n=3000, offset=1000)
    _zero_page_holding(path, encoded(2500))
    kind, result = in_child(_verify_error, str(path))
    assert kind == "ok", (kind, result)  # no abort inside liblmdb
    assert "damaged LMDB structure at page" in result, result


# -- damaged and foreign files --------------------------------------------------------------------------


def _without_meta(path: Path) -> None:
    env = raw_env(path)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(_format.META_DB, txn=txn), delete=True)
    env.close()


def _set_meta(path: Path, **changes: Any) -> None:
    meta = msgpack.unpackb(_read_meta(path))
    meta.update(changes)
    put(path, _format.META_DB, _format.META_KEY, msgpack.packb(meta, use_bin_type=True))


def _read_meta(path: Path) -> bytes:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
    try:
        with env.begin(db=env.open_db(_format.META_DB, create=False)) as txn:
            return bytes(txn.get(_format.META_KEY))
    finally:
        env.close()


def _truncate(fraction: float) -> Callable[[Path], None]:
    def cut(path: Path) -> None:
        os.truncate(path, int(path.stat().st_size * fraction))

    return cut


def _truncate_to(nbytes: int) -> Callable[[Path], None]:
    def cut(path: Path) -> None:
        os.truncate(path, nbytes)

    return cut


def _truncate_by(nbytes: int) -> Callable[[Path], None]:
    def cut(path: Path) -> None:
        os.truncate(path, path.stat().st_size - nbytes)

    return cut


def _replace_with(data: bytes) -> Callable[[Path], None]:
    def replace(path: Path) -> None:
        path.write_bytes(data)

    return replace


def _make_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE: dict[str, tuple[Callable[[Path], None], type[Exception], str]] = {
    "missing": (lambda p: p.unlink(), RecordNotFoundError, "write one with torchrecord.write_record"),
    "directory": (_make_dir, NotARecordSetError, "a single file written by write_record"),
    "empty": (_replace_with(b""), NotARecordSetError, "empty file"),
    "text": (_replace_with(b"id,label\n1,cat\n" * 500), NotARecordSetError, "not an LMDB file"),
    "random bytes": (_replace_with(bytes(range(256)) * 64), NotARecordSetError, "not an LMDB file"),
    "truncated to half": (_truncate(0.5), CorruptRecordError, "truncated"),
    "truncated to 1 page": (_truncate_to(4096), NotARecordSetError, "not an LMDB file"),
    "truncated to 2 pages": (_truncate_to(8192), CorruptRecordError, "truncated"),
    "truncated by 1 byte": (_truncate_by(1), CorruptRecordError, "truncated"),
    "truncated by 1 page": (_truncate_by(4096), CorruptRecordError, "truncated"),
    "no metadata database": (_without_meta, NotARecordSetError, "not written by torchrecord.write_record"),
    "no metadata record": (
        lambda p: put(p, _format.META_DB, _format.META_KEY, None),
        NotARecordSetError,
        "holds no metadata record",
    ),
    "metadata not msgpack": (
        lambda p: put(p, _format.META_DB, _format.META_KEY, b"\xc1\xc1"),
        NotARecordSetError,
        "not valid msgpack",
    ),
    "newer format version": (lambda p: _set_meta(p, format_version=99), VersionError, "Upgrade torchrecord"),
    "unfinished write": (lambda p: _set_meta(p, complete=False), IncompleteRecordSetError, "write it again"),
    "foreign metadata": (lambda p: _set_meta(p, format="other"), NotARecordSetError, "check the path"),
    "bad schema": (lambda p: _set_meta(p, schema={"tree": 1}), FormatError, "schema"),
}


def _open_all_ways(path: str) -> list[tuple[str, str, str]]:
    """(way, error type, message) for every way of opening or reading ``path``."""
    outcomes = []
    ways: dict[str, Callable[[], Any]] = {
        "len(RecordFile)": lambda: len(torchrecord.RecordFile(path)),
        "verify": lambda: torchrecord.verify(path),
        "RecordDataset": lambda: list(torchrecord.RecordDataset(path)),
        "RecordDataset batches": lambda: list(torchrecord.RecordDataset(path, batch_size=8)),
    }
    for way, read in ways.items():
        try:
            read()
            outcomes.append((way, "no error", ""))
        except Exception as exc:
            outcomes.append((way, type(exc).__name__, str(exc)))
    return outcomes


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_file_raises_a_clear_error(tmp_path: Path, damage: str) -> None:
    path = write(tmp_path / "set.tr", n=2000)
    harm, expected, hint = DAMAGE[damage]
    harm(path)
    kind, outcomes = in_child(_open_all_ways, str(path))
    assert kind == "ok", f"reading crashed the process: {kind} {outcomes}"
    for way, error, message in outcomes:
        assert error != "no error", f"{way} read a {damage} file without complaint"
        raised = getattr(torchrecord.errors, error, None)
        assert raised is not None and issubclass(raised, expected), (way, error, message)
        assert str(path) in message and hint in message, (way, message)


def test_truncation_is_caught_inside_dataloader_workers(tmp_path: Path) -> None:
    """The dataset is built on a good file, the file is cut, then workers open it: a clear error."""
    path = write(tmp_path / "set.tr", n=2000)
    dataset = torchrecord.RecordDataset(path, batch_size=16)
    os.truncate(path, path.stat().st_size // 2)

    def read() -> int:
        return sum(1 for _ in DataLoader(dataset, batch_size=None, num_workers=2))

    kind, result = in_child(read)
    assert kind == "raised" and result[0] == "CorruptRecordError", (kind, result)
    assert "truncated" in result[1] and str(path) in result[1]


# -- rewritten while being read --------------------------------------------------------------------------


def test_old_reader_keeps_its_snapshot_in_the_same_process(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=500)
    old = torchrecord.RecordFile(path)
    iterator = iter(old)
    first = [next(iterator)[1] for _ in range(100)]
    stream = iter(torchrecord.RecordDataset(path, shuffle=False))
    first_stream = [next(stream)[1] for _ in range(100)]

    write(tmp_path / "set.tr", n=300, offset=10_000, overwrite=True)

    new = torchrecord.RecordFile(path)
    assert sorted(labels_of(path)) == list(range(10_000, 10_300))  # new readers see the new set
    assert len(new) == 300
    rest = [label for _, label in iterator]  # the old iteration finishes on the old set
    assert first + rest == list(range(500))
    assert first_stream + [label for _, label in stream] == list(range(500))
    assert len(old) == 500 and old[499][1] == 499  # random access too: the old snapshot


def _read_across_a_rewrite(path: str, halfway: Any, rewritten: Any) -> list[int]:
    reader = torchrecord.RecordFile(path)
    labels = []
    for i, (image, label) in enumerate(reader):
        assert int(image.flatten()[0]) == label % 251
        labels.append(label)
        if i == len(reader) // 2:
            halfway.set()
            assert rewritten.wait(60)
    return labels


def test_old_reader_process_keeps_its_snapshot(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=1000)
    halfway, rewritten = FORK.Event(), FORK.Event()
    parent, child = FORK.Pipe(duplex=False)
    reader = FORK.Process(target=lambda: child.send(_read_across_a_rewrite(str(path), halfway, rewritten)))
    reader.start()
    assert halfway.wait(60)
    writer = FORK.Process(target=write, args=(path, 400, 50_000), kwargs={"overwrite": True})
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    rewritten.set()
    assert parent.poll(60)
    labels = parent.recv()
    reader.join(60)
    assert labels == list(range(1000))  # all old, in order, complete: never a mix
    assert_is_set(path, 400, 50_000)


def test_dataloader_workers_keep_their_snapshot(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=2000)
    loader = DataLoader(torchrecord.RecordDataset(path, batch_size=20, shuffle=False), batch_size=None, num_workers=2)
    batches = iter(loader)
    labels = [int(x) for _ in range(10) for x in next(batches)[1]]
    proc = FORK.Process(target=write, args=(path, 700, 90_000), kwargs={"overwrite": True})
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    labels += [int(x) for batch in batches for x in batch[1]]
    assert sorted(labels) == list(range(2000))


def _reader_loop(path: str, stop: Any) -> list[tuple[int, int]]:
    """Open and read the whole set again and again; returns (first label, count) per pass."""
    passes = []
    while not stop.is_set() or not passes:
        labels = [label for _, label in torchrecord.RecordFile(path)]
        base = labels[0] - labels[0] % 10_000
        assert labels == list(range(base, base + len(labels))), "a pass mixed two record sets"
        passes.append((base, len(labels)))
    return passes


def _rewrites(tmp_path: Path, rounds: int) -> set[tuple[int, int]]:
    path = write(tmp_path / "set.tr", n=500)
    stop = FORK.Event()
    parent, child = FORK.Pipe(duplex=False)
    reader = FORK.Process(target=lambda: child.send(_reader_loop(str(path), stop)))
    reader.start()
    for r in range(1, rounds + 1):
        write(path, 500 + 100 * (r % 3), 10_000 * r, overwrite=True)
    stop.set()
    assert parent.poll(120)
    passes = parent.recv()
    reader.join(60)
    assert reader.exitcode == 0
    for base, count in passes:
        assert count == 500 + 100 * ((base // 10_000) % 3)
    return set(passes)


def test_repeated_rewrites_never_mix(tmp_path: Path) -> None:
    _rewrites(tmp_path, 12)


@pytest.mark.slow
def test_repeated_rewrites_never_mix_many(tmp_path: Path) -> None:
    assert len(_rewrites(tmp_path, 300)) > 10
