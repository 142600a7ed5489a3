"""Error classes: every error the package raises on purpose is a TorchRecordError of its kind, still
catchable as the builtin it was, and importable from ``torchrecord``.

The scan below reads every module of the package: a ``raise`` of a plain builtin exception, a builtin
exception built to be raised later, or an exception class of the package's own that derives from a
builtin instead of from :mod:`torchrecord.errors`, fails the test unless it is in the short allow-lists
(each entry with its reason; an entry that no longer matches anything fails too).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
import torchrecord.errors as errors
from torchrecord import MixedDataset, RecordDataset, RecordFile, RecordWriter, StreamDataset, write_record
from torchrecord._write.sources import normalize

PACKAGE = Path(torchrecord.__file__).resolve().parent

#: The builtins the package must not raise plainly (a TorchRecordError subclass keeps each catchable).
BUILTINS = {
    "ValueError",
    "TypeError",
    "IndexError",
    "KeyError",
    "ImportError",
    "ModuleNotFoundError",
    "RuntimeError",
    "OSError",
    "IOError",
    "EnvironmentError",
    "FileExistsError",
    "FileNotFoundError",
    "PermissionError",
    "NotImplementedError",
    "LookupError",
    "Exception",
}
#: Built without a raise: ``Exception`` aside (the command line builds one to print a message's first line).
BUILT = BUILTINS - {"Exception"}

#: (module under torchrecord/, the raise as written, comment aside) -> why it stays a builtin.
ALLOWED_RAISES: dict[tuple[str, str], str] = {
    ("_read/base.py", "raise NotImplementedError"): (
        "the hooks every ReaderDataset subclass implements (_set_id, _where, _per_rank)"
    ),
    ("_mix/source.py", "raise NotImplementedError"): (
        "the abstract methods of the Source interface: a subclass implements them"
    ),
    ("_write/publish.py", "raise FileExistsError(err, os.strerror(err), target)"): (
        "renameat2 reports EEXIST as os.rename would; _move_no_replace turns it into RecordExistsError"
    ),
    ("_write/publish.py", "raise OSError(err, os.strerror(err), temp)"): (
        "renameat2's other errors, as os.rename would raise them; as_write_error makes them a WriteError"
    ),
    ("convert/images.py", "raise ValueError(\"expected extensions such as .jpg,.png, or '*' for every file\")"): (
        "an argparse type= function: argparse turns its ValueError into the command line's usage error"
    ),
    (
        "_read/slot_maps.py",
        'raise OSError(code, f"mmap of a {size}-byte shared-memory slot failed: {os.strerror(code)}")',
    ): ("mmap(2) called through ctypes reports its error as the mmap module did before (an OSError with its errno)"),
    ("_core/varint.py", 'raise ValueError("varint too long")'): (
        "an internal signal: WireDecoder and the Expander catch it and hand the record to the checked protobuf "
        "path, which names it"
    ),
    ("_core/wire.py", 'raise ValueError("bool bytes other than 0 and 1")'): (
        "an internal signal: WireDecoder catches it and hands the record to the checked path, which names the field"
    ),
}

#: (module, class) -> why an exception class of the package derives from a builtin, not from errors:
#: internal signals, each caught inside the package and never seen by a user.
ALLOWED_CLASSES: dict[tuple[str, str], str] = {
    ("_core/compress.py", "_NotCanonical"): (
        "a compressed record is not the writer's canonical encoding: the fast reader catches it and "
        "decodes that record the checked way"
    ),
    ("_store/format.py", "_TooMany"): "raised in msgpack's hooks; read_metadata turns it into a FormatError",
    ("_write/fast_leaves.py", "Mismatch"): "a sample the fast encoder cannot take: it goes the general way",
    ("_storage/transfer.py", "Damaged"): (
        "one transfer's data did not match what was expected: with_retries catches it and tries again within the "
        "deadline, then raises a FetchError naming the shard"
    ),
    ("_write/shard_plan.py", "Superseded"): (
        "the set was finalized by this writer's own attempt while it wrote: write_shard catches it and returns the "
        "finalized shard"
    ),
}

_BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _names(node: ast.expr) -> list[str]:
    """Names an exception expression may evaluate to: ``X``, ``X(...)``, ``(X if c else Y)(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.IfExp):
        return _names(target.body) + _names(target.orelse)
    return []


def scan(root: Path) -> list[tuple[str, int, str, str]]:
    """(module, line, what, source) of each builtin raised or built, and each class deriving from one."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module == "errors.py" or path.name.endswith("_pb2.py"):
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        raised: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                if isinstance(node.exc, ast.Call):
                    raised.add(id(node.exc))
                hits = [n for n in _names(node.exc) if n in BUILTINS]
                if hits:
                    segment = " ".join((ast.get_source_segment(source, node) or "").split())
                    found.append((module, node.lineno, f"raise {'/'.join(hits)}", segment))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in raised:
                if isinstance(node.func, ast.Name) and node.func.id in BUILT:
                    segment = " ".join((ast.get_source_segment(source, node) or "").split())
                    found.append((module, node.lineno, f"builds {node.func.id}", segment))
            elif isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if any(b in _BUILTIN_EXCEPTIONS for b in bases):
                    found.append((module, node.lineno, "class", node.name))
    return sorted(found)


def _not_allowed(found: list[tuple[str, int, str, str]]) -> list[str]:
    bad = []
    for module, line, what, source in found:
        allowed = (module, source) in (ALLOWED_CLASSES if what == "class" else ALLOWED_RAISES)
        if not allowed:
            bad.append(f"torchrecord/{module}:{line}: {what}: {source}")
    return bad


def test_no_plain_builtin_is_raised_on_purpose() -> None:
    bad = _not_allowed(scan(PACKAGE))
    assert not bad, "raise a torchrecord.errors class (or allow-list the site with its reason):\n" + "\n".join(bad)


def test_every_allowed_site_still_exists() -> None:
    """An allow-list entry whose site is gone (fixed or reworded) is removed, not kept."""
    found = scan(PACKAGE)
    sites = {(m, s) for m, _, w, s in found if w != "class"}
    classes = {(m, s) for m, _, w, s in found if w == "class"}
    assert set(ALLOWED_RAISES) <= sites, set(ALLOWED_RAISES) - sites
    assert set(ALLOWED_CLASSES) <= classes, set(ALLOWED_CLASSES) - classes


def test_the_scan_finds_a_planted_builtin(tmp_path: Path) -> None:
    """Control: each way of raising a builtin is found, and an allow-listed site is not reported."""
    (tmp_path / "_planted").mkdir()
    (tmp_path / "_planted" / "bad.py").write_text(
        "def f(x):\n"
        "    if x:\n"
        "        raise ValueError(f'bad {x}')\n"
        "    raise (TypeError if x is None else IndexError)('either')\n"
        "def g():\n"
        "    exc = KeyError('built, raised later')\n"
        "    raise exc\n"
        "def h():\n"
        "    raise RuntimeError\n"
        "class _Signal(ValueError):\n"
        "    pass\n",
        encoding="utf-8",
    )
    (tmp_path / "_mix").mkdir()
    (tmp_path / "_mix" / "source.py").write_text(
        "class Source:\n    def read(self):\n        raise NotImplementedError  # the interface\n", encoding="utf-8"
    )
    found = scan(tmp_path)
    assert [(m, line, what) for m, line, what, _ in found] == [
        ("_mix/source.py", 3, "raise NotImplementedError"),
        ("_planted/bad.py", 3, "raise ValueError"),
        ("_planted/bad.py", 4, "raise TypeError/IndexError"),
        ("_planted/bad.py", 6, "builds KeyError"),
        ("_planted/bad.py", 9, "raise RuntimeError"),
        ("_planted/bad.py", 10, "class"),
    ]
    assert len(_not_allowed(found)) == 5  # all but the allow-listed interface method


# -- the classes -----------------------------------------------------------------------

#: Each class added for a kind of error, and the builtin it stays catchable as.
KINDS: list[tuple[type[Exception], type[Exception]]] = [
    (errors.ArgumentError, ValueError),
    (errors.ResumeStateError, ValueError),
    (errors.LoaderMismatchError, ValueError),
    (errors.ArgumentTypeError, TypeError),
    (errors.IndexOutOfRangeError, IndexError),
    (errors.MissingDependencyError, ImportError),
    (errors.SampleValueError, ValueError),
    (errors.SampleTypeError, TypeError),
    (errors.WriterClosedError, ValueError),
    (errors.InternalError, RuntimeError),
]


@pytest.mark.parametrize(("cls", "builtin"), KINDS, ids=[c.__name__ for c, _ in KINDS])
def test_each_kind_is_a_torchrecord_error_and_its_builtin(cls: type[Exception], builtin: type[Exception]) -> None:
    error = cls("message")
    assert isinstance(error, errors.TorchRecordError) and isinstance(error, builtin)
    assert str(error) == "message"
    with pytest.raises(builtin):
        raise error
    assert cls.__doc__ and len(inspect.cleandoc(cls.__doc__)) > 20


def test_resume_and_loader_errors_are_argument_errors() -> None:
    assert issubclass(errors.ResumeStateError, errors.ArgumentError)
    assert issubclass(errors.LoaderMismatchError, errors.ArgumentError)


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_and_warning_class_is_importable_from_torchrecord(name: str) -> None:
    assert name in torchrecord.__all__
    assert getattr(torchrecord, name) is getattr(errors, name)


def test_every_class_of_the_errors_module_is_listed() -> None:
    defined = {n for n, v in vars(errors).items() if inspect.isclass(v) and v.__module__ == errors.__name__}
    assert defined == set(errors.__all__)
    words = (errors.__doc__ or "").split()
    for name in defined:  # each named in the tree of the module's docstring
        assert name in words, name


# -- real cases raise them -------------------------------------------------------------


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> str:
    """40 frames in 8 sequences of 5 (group_by="seq")."""
    path = tmp_path_factory.mktemp("errors") / "seqs.tr"
    frames = [{"x": np.array([i, i], np.float32), "seq": i // 5} for i in range(40)]
    write_record(frames, path, group_by="seq", seed=1, progress=False)
    return str(path)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("errors") / "plain.tr"
    write_record([(torch.full((2,), float(i)), i) for i in range(30)], path, progress=False)
    return str(path)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another set with the samples of ``plain``'s kind (for mixes)."""
    path = tmp_path_factory.mktemp("errors") / "other.tr"
    write_record([(torch.full((2,), -float(i)), i) for i in range(20)], path, progress=False)
    return str(path)


def test_a_bad_argument_is_an_argument_error(plain: str) -> None:
    with pytest.raises(errors.ArgumentError, match="shuffle_buffer") as info:
        RecordDataset(plain, shuffle_buffer=-1)
    assert isinstance(info.value, ValueError)
    with pytest.raises(errors.ArgumentError, match="rank 2 is not in"):
        RecordDataset(plain, rank=2, world_size=2)


def test_a_wrong_type_is_an_argument_type_error(plain: str) -> None:
    rf = RecordFile(plain)
    with pytest.raises(errors.ArgumentTypeError, match="is a bool") as info:
        rf[True]
    assert isinstance(info.value, TypeError)
    with pytest.raises(errors.ArgumentTypeError, match="compression must be"):
        write_record([torch.zeros(2)], Path(plain).with_name("x.tr"), compression=3, progress=False)


def test_an_index_out_of_range_is_an_index_out_of_range_error(plain: str, grouped: str) -> None:
    with pytest.raises(errors.IndexOutOfRangeError, match=r"out of range for .* with 30 samples") as info:
        RecordFile(plain)[10**9]
    assert isinstance(info.value, IndexError)
    with pytest.raises(IndexError, match="out of range"):
        RecordFile(plain)[[0, 30]]
    with pytest.raises(errors.IndexOutOfRangeError, match="group index 99 out of range"):
        RecordFile(grouped).group(99)


def test_a_state_of_another_set_is_a_resume_state_error(plain: str, grouped: str) -> None:
    state = RecordDataset(plain).state_dict()
    with pytest.raises(errors.ResumeStateError, match="another record set") as info:
        RecordDataset(grouped).load_state_dict(state)
    assert isinstance(info.value, ValueError)
    with pytest.raises(errors.ResumeStateError, match=r"no torchrecord\.RecordDataset state found"):
        RecordDataset(plain).load_state_dict({"epoch": 0})
    with pytest.raises(errors.ResumeStateError, match="upgrade torchrecord"):
        RecordDataset(plain).load_state_dict({**state, "version": 10**6})
    with pytest.raises(errors.ResumeStateError, match="set_epoch"):
        RecordDataset(plain).load_state_dict({**state, "epoch": 5})
    with pytest.raises(errors.ResumeStateError, match="no torchrecord reader state found"):
        torchrecord.loader_position({"something": 1})


def test_a_state_of_another_stream_plan_is_a_resume_state_error(grouped: str) -> None:
    state = StreamDataset(grouped, batch_size=4, steps=2, seed=0).state_dict()
    StreamDataset(grouped, batch_size=4, steps=2, seed=0).load_state_dict(state)  # the same plan: accepted
    with pytest.raises(errors.ResumeStateError, match="StreamDataset state was saved with streams=4") as info:
        StreamDataset(grouped, batch_size=2, steps=2, seed=0).load_state_dict(state)
    assert isinstance(info.value, ValueError)
    with pytest.raises(errors.ResumeStateError, match="StreamDataset state found"):
        StreamDataset(grouped, batch_size=4, steps=2, seed=0).load_state_dict({"x": 1})


def test_a_mixed_state_with_other_settings_is_a_resume_state_error(plain: str, other: str) -> None:
    state = MixedDataset([plain, other], weights=[1, 1], epoch_size=20, seed=0).state_dict()
    with pytest.raises(errors.ResumeStateError, match="saved with seed=0") as info:
        MixedDataset([plain, other], weights=[1, 1], epoch_size=20, seed=1).load_state_dict(state)
    assert isinstance(info.value, ValueError)


def test_bad_weights_are_an_argument_error(plain: str, other: str) -> None:
    with pytest.raises(errors.ArgumentError, match="one weight per source") as info:
        MixedDataset([plain, other], weights=[1])
    assert isinstance(info.value, ValueError)
    with pytest.raises(errors.ArgumentError, match="finite number >= 0"):
        MixedDataset([plain, other], weights=[1, -1])


def test_a_loader_that_breaks_the_dataset_is_a_loader_mismatch_error(plain: str, grouped: str) -> None:
    ds = RecordDataset(plain)
    with pytest.raises(errors.LoaderMismatchError, match="does not read this dataset") as info:
        ds.check_loader(DataLoader(RecordDataset(plain), batch_size=4))
    assert isinstance(info.value, errors.ArgumentError) and isinstance(info.value, ValueError)
    streams = StreamDataset(grouped, batch_size=2, steps=2)
    with pytest.raises(errors.LoaderMismatchError, match="batch_size=None"):
        streams.check_loader(DataLoader(streams, batch_size=2))


def test_an_unstorable_sample_is_a_sample_error(tmp_path: Path) -> None:
    with pytest.raises(errors.SampleValueError, match=r"field 'big': int .* does not fit in int64") as value:
        normalize({"big": 2**70})
    assert isinstance(value.value, ValueError)
    with pytest.raises(errors.SampleTypeError, match="field 'odd': cannot store a leaf of type set") as kind:
        normalize({"odd": {1, 2}})
    assert isinstance(kind.value, TypeError)
    with pytest.raises(errors.SampleTypeError, match="dict keys in a sample must be str"):
        normalize({1: 2})
    # in a write, the error names the file, the sample and the field
    with pytest.raises(errors.SampleTypeError, match=r"s\.tr: sample 1, field 'odd'"):
        write_record([{"odd": 1}, {"odd": {1}}], tmp_path / "s.tr", progress=False)


def test_a_published_writer_is_closed(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "w.tr", progress=False) as w:
        w.append(torch.zeros(2))
    with pytest.raises(errors.WriterClosedError, match="was published") as info:
        w.append(torch.zeros(2))
    assert isinstance(info.value, ValueError)


def test_a_missing_optional_package_is_a_missing_dependency_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cramjam", None)  # `import cramjam` now fails as if not installed
    with pytest.raises(errors.MissingDependencyError, match="needs cramjam: pip install") as info:
        write_record([torch.zeros(4)], tmp_path / "z.tr", compression="zstd", progress=False)
    assert isinstance(info.value, ImportError)


def test_the_command_line_prints_the_new_classes_as_user_errors(plain: str, capsys: pytest.CaptureFixture[str]) -> None:
    from torchrecord.cli import main

    assert main(["head", plain, "--index", "99"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchrecord head: error: ") and "out of range" in err and "Traceback" not in err


def _first_kind(fn: Any) -> type[BaseException] | None:
    try:
        fn()
    except BaseException as exc:
        return type(exc)
    return None


def test_old_catch_clauses_still_catch(plain: str) -> None:
    """``except ValueError`` / ``except IndexError`` written against the old builtins keep working."""
    for fn, builtin in (
        (lambda: RecordDataset(plain, shuffle_buffer=-1), ValueError),
        (lambda: RecordFile(plain)[10**9], IndexError),
        (lambda: RecordFile(plain)["a"], TypeError),
    ):
        kind = _first_kind(fn)
        assert kind is not None and issubclass(kind, builtin) and issubclass(kind, errors.TorchRecordError)
