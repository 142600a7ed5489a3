"""Every public property and method has a docstring, and every argument of a public function is documented."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import torchrecord

PUBLIC = [n for n in torchrecord.__all__ if n != "__version__"]
#: The write options are documented once, in these TypedDicts; a function taking them refers to them.
OPTIONS_DOC = "".join(
    inspect.getdoc(t) or "" for t in (torchrecord.WriteOptions, torchrecord.WriterOptions, torchrecord.StoreOptions)
)


def _undocumented_parameters(func: Any, doc: str | None, owner: str) -> list[str]:
    """Parameters of ``func`` whose name does not appear in ``doc`` (``*args``/``**kwargs`` aside).

    A write option counts as documented when ``doc`` names its TypedDict (``WriteOptions``...) and that
    TypedDict's docstring documents it.
    """
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    refers = "Options`" in (doc or "")
    return [
        f"{owner}({name})"
        for name, param in sig.parameters.items()
        if name not in ("self", "cls")
        and param.kind not in skip
        and name not in (doc or "")
        and not (refers and f"    {name}: " in OPTIONS_DOC)
    ]


def _members(cls: type) -> list[tuple[str, Any, bool]]:
    """(name, function, is_property) of a class's own public members."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out.append((name, value.fget, True))
        elif isinstance(value, (staticmethod, classmethod)):
            out.append((name, value.__func__, False))
        elif inspect.isfunction(value):
            out.append((name, value, False))
    return out


@pytest.mark.parametrize("name", PUBLIC)
def test_public_members_and_arguments_are_documented(name: str) -> None:
    obj = getattr(torchrecord, name)
    if inspect.isfunction(obj):
        assert not _undocumented_parameters(obj, obj.__doc__, name)
        return
    problems = _undocumented_parameters(obj.__init__, obj.__doc__, name)
    for member, func, is_property in _members(obj):
        if not (func.__doc__ or "").strip():
            problems.append(f"{name}.{member} has no docstring")
        elif not is_property:
            problems += _undocumented_parameters(func, func.__doc__, f"{name}.{member}")
    assert not problems, problems


def test_the_check_can_fail() -> None:
    """Control: an undocumented argument and a property without a docstring are noticed."""

    class Thing:
        """A thing."""

        def __init__(self, size: int) -> None:
            self.size = size

        @property
        def area(self) -> int:
            return self.size

    assert _undocumented_parameters(Thing.__init__, Thing.__doc__, "Thing") == ["Thing(size)"]
    assert [m for m, f, _ in _members(Thing) if not f.__doc__] == ["area"]
