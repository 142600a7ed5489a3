"""The public surface: sorted __all__ everywhere, and documented, typed public names."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from types import ModuleType
from typing import Any

import pytest

import torchrecord
import torchrecord.errors

#: Generated code (scripts/gen_proto.py) keeps the layout its generator gives it.
GENERATED = {"torchrecord._proto.torchrecord_pb2"}
#: Importing these runs a program.
NOT_IMPORTABLE = {"torchrecord.__main__"}


def _module_names() -> list[str]:
    names = ["torchrecord"]
    for info in pkgutil.walk_packages(torchrecord.__path__, "torchrecord."):
        if info.name not in NOT_IMPORTABLE:
            names.append(info.name)
    return names


MODULES = _module_names()


def test_modules_are_found() -> None:
    """Control: the walk sees the package's modules (an empty walk would pass everything)."""
    for name in (
        "torchrecord._write.writer",
        "torchrecord._read.dataset",
        "torchrecord._order.partition",
        "torchrecord.errors",
        "torchrecord._memory.batches",
        "torchrecord._write.shards",
        "torchrecord._shards.sharded",
        "torchrecord._mix.dataset",
        "torchrecord._order.mix_plan",
    ):
        assert name in MODULES


def _defines_public_names(module: ModuleType) -> bool:
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == module.__name__:
            return True
    return False


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert name in GENERATED or not _defines_public_names(module), f"{name} defines public names but no __all__"
        return
    assert list(exported) == sorted(exported), f"{name}.__all__ is not sorted: {exported}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what the module does not define: {missing}"


def test_top_level_exports() -> None:
    for name in (
        "write_record",
        "RecordWriter",
        "RecordDataset",
        "RecordFile",
        "RecordSet",
        "open_set",
        "StreamDataset",
        "StreamLoader",
        "RecordLoader",
        "verify",
        "TorchRecordError",
        "__version__",
        "load",
        "loader_position",
        "BatchIter",
        "GroupBatchIter",
        "SampleList",
        "SequenceDataset",
        "WindowDataset",
        "ShardedSet",
        "finalize_shards",
        "write_shard",
        "MixedDataset",
    ):
        assert name in torchrecord.__all__
    for name in torchrecord.errors.__all__:  # every error and warning class, from the face too
        assert name in torchrecord.__all__ and getattr(torchrecord, name) is getattr(torchrecord.errors, name)
    assert isinstance(torchrecord.__version__, str) and torchrecord.__version__


def _missing_hints(func: Any, owner: str) -> list[str]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    missing = []
    for i, (pname, param) in enumerate(sig.parameters.items()):
        if i == 0 and pname in ("self", "cls"):
            continue
        if param.annotation is inspect.Parameter.empty:
            missing.append(f"{owner}({pname})")
    if sig.return_annotation is inspect.Signature.empty:
        missing.append(f"{owner} -> ?")
    return missing


def _public_members(cls: type) -> list[tuple[str, Any]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, property):
            members.append((name, value.fget))
        elif isinstance(value, (staticmethod, classmethod)):
            members.append((name, value.__func__))
        elif inspect.isfunction(value):
            members.append((name, value))
    return members


PUBLIC = [n for n in torchrecord.__all__ if n != "__version__"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_have_docstrings_and_type_hints(name: str) -> None:
    obj = getattr(torchrecord, name)
    assert inspect.isfunction(obj) or inspect.isclass(obj), name
    doc = inspect.getdoc(obj)
    assert doc and len(doc) > 20, f"{name} has no real docstring"
    if inspect.isfunction(obj):
        assert not _missing_hints(obj, name)
        return
    missing = []
    for member, func in _public_members(obj):
        missing += _missing_hints(func, f"{name}.{member}")
    assert not missing, f"missing type hints: {missing}"


def test_hint_check_can_fail() -> None:
    """Control: the checker notices a missing hint."""

    def untyped(x, y: int):  # type: ignore[no-untyped-def]
        return x

    assert _missing_hints(untyped, "untyped") == ["untyped(x)", "untyped -> ?"]


@pytest.mark.parametrize("name", torchrecord.errors.__all__)
def test_errors_are_documented_torchrecord_errors(name: str) -> None:
    cls = getattr(torchrecord.errors, name)
    errors = torchrecord.errors
    assert issubclass(cls, errors.TorchRecordError) or issubclass(cls, errors.TorchRecordWarning)
    assert cls.__doc__ and cls.__doc__.strip()


def test_errors_keep_builtin_bases() -> None:
    e = torchrecord.errors
    assert issubclass(e.RecordNotFoundError, FileNotFoundError)
    assert issubclass(e.RecordExistsError, FileExistsError)
    assert issubclass(e.FormatError, ValueError)
    assert issubclass(e.SchemaError, ValueError)
    assert issubclass(e.WriteError, OSError)
    for name in ("NotARecordSetError", "IncompleteRecordSetError", "VersionError", "CorruptRecordError"):
        assert issubclass(getattr(e, name), e.FormatError)
    assert issubclass(e.ChecksumError, e.CorruptRecordError)


@pytest.mark.parametrize("name", PUBLIC)
def test_no_public_name_lives_in_a_private_module(name: str) -> None:
    """help(), reprs and pickles show ``torchrecord.NAME`` (or a public module), never ``torchrecord._x``."""
    obj = getattr(torchrecord, name)
    assert not any(part.startswith("_") for part in obj.__module__.split(".")), obj.__module__
    assert pickle.loads(pickle.dumps(obj)) is obj
