"""Every registered converter is complete (issue 37): docs/ARCHITECTURE.md's recipe, kept true.

A converter is one module, one registry line and one test file. What the rest of the package reads
from the entry (convert(), detection, the command line's flags, choices and help) is checked here
against the converter's own signature, and the docs that must name it are checked to do so.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

import torchrecord.convert
from torchrecord import WriteOptions
from torchrecord.cli import build_parser
from torchrecord.convert._common import Converter, Option, Probe
from torchrecord.convert.registry import REGISTRY, SHARDING, options

ROOT = Path(__file__).resolve().parents[2]
WRITE_OPTIONS = set(WriteOptions.__annotations__)


def _convert_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["convert"]
    return parser


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """flag -> dest of every optional argument of the parser."""
    return {flag: action.dest for action in parser._actions for flag in action.option_strings}


def problems(converter: Converter, parser: argparse.ArgumentParser, docs: str, tests: str) -> list[str]:
    """Every way ``converter``'s entry disagrees with its function, the command line, the docs or the tests."""
    out = []
    name = converter.name
    parameters = inspect.signature(converter.function).parameters
    for option in converter.options:
        parameter = converter.parameters.get(option.name, option.name)
        if parameter not in parameters:
            out.append(f"{name}: the function takes no {parameter!r} (option {option.name!r})")
        if _flags(parser).get(option.flag) != option.name:
            out.append(f"{name}: torchrecord convert has no {option.flag} for {option.name!r}")
        if option.name in WRITE_OPTIONS or option.name in SHARDING:
            out.append(f"{name}: option {option.name!r} is a write or sharding option")
    for option in sorted(WRITE_OPTIONS | set(SHARDING)):
        if option in converter.refused and option in parameters:
            out.append(f"{name}: refuses {option!r}, which its function takes")
        if option not in converter.refused and option not in parameters:
            out.append(f"{name}: its function lacks {option!r} and the entry does not refuse it")
    for refused in converter.refused:
        if refused not in WRITE_OPTIONS and refused not in SHARDING:
            out.append(f"{name}: refuses {refused!r}, which is no write or sharding option")
    action = next(a for a in parser._actions if a.dest == "format")
    if name not in (action.choices or ()):
        out.append(f"{name}: not a --format choice")
    if " ".join(converter.summary.split()) not in " ".join(parser.format_help().split()):
        out.append(f"{name}: its summary is not in torchrecord convert --help")
    if f"`{name}`" not in docs and f"``{name}``" not in docs:
        out.append(f"{name}: docs/cli.md and the torchrecord.convert docstring do not name the format `{name}`")
    function = converter.function.__name__
    if function not in torchrecord.convert.__all__:
        out.append(f"{name}: torchrecord.convert does not export {function}")
    if function not in tests:
        out.append(f"{name}: no test in tests/convert (or tests/<format>) calls {function}")
    return out


def _docs() -> str:
    return (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") + (torchrecord.convert.__doc__ or "")


def _tests() -> str:
    """The converters' tests: tests/convert, and a format's own folder (tests/lerobot, its oracle beside it)."""
    folders = [ROOT / "tests" / "convert", *(ROOT / "tests" / name for name in REGISTRY)]
    return "".join(p.read_text(encoding="utf-8") for f in folders if f.is_dir() for p in f.glob("test_*.py"))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_converter_is_complete(name: str) -> None:
    assert problems(REGISTRY[name], _convert_parser(), _docs(), _tests()) == []


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_converter_module_is_on_the_architecture_page(name: str) -> None:
    module = REGISTRY[name].function.__module__.replace("torchrecord.", "").replace(".", "/") + ".py"
    assert f"`{module}`" in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def test_convert_and_the_command_line_read_the_registry() -> None:
    parameters = inspect.signature(torchrecord.convert.convert).parameters
    assert set(options()) | set(SHARDING) | WRITE_OPTIONS | {"source", "path", "format"} == set(parameters)
    choices = next(a for a in _convert_parser()._actions if a.dest == "format").choices
    assert list(choices or ()) == ["auto", *REGISTRY]
    assert tuple(REGISTRY) == torchrecord.convert.FORMATS
    assert {n: c.function for n, c in REGISTRY.items()} == torchrecord.convert.CONVERTERS


def test_a_planted_incomplete_converter_is_found() -> None:
    """The control: an entry that drifts from its function, flags and docs in each way is caught."""

    def from_nothing(source: str, path: str, *, depth: int = 0, seed: int = 0) -> None:
        """A converter that takes one write option only."""

    planted = Converter(
        "nothing",
        from_nothing,
        "no such format",
        options=(Option("width", 0, "int", "--width", "not a flag anywhere"), Option("seed", 0, "int", "--s", "")),
        refused={"seed": "planted", "colour": "planted"},
    )
    found = problems(planted, _convert_parser(), "", "")
    for expected in (
        "the function takes no 'width'",
        "torchrecord convert has no --width",
        "option 'seed' is a write or sharding option",
        "refuses 'seed', which its function takes",
        "its function lacks 'shuffle'",
        "its function lacks 'shard'",
        "refuses 'colour', which is no write or sharding option",
        "not a --format choice",
        "its summary is not in torchrecord convert --help",
        "do not name the format `nothing`",
        "does not export from_nothing",
        "no test in tests/convert (or tests/<format>) calls from_nothing",
    ):
        assert any(expected in line for line in found), (expected, found)


@pytest.mark.parametrize(
    ("path", "is_dir", "head", "expected"),
    [
        ("x.tar", False, b"", "webdataset"),
        ("x", False, b"\x93NUMPY\x01\x00", "npy"),
        ("x", False, b"PK\x03\x04", "npz"),
        ("x.h5", False, b"", "hdf5"),
        ("x.txt", False, b"a.png 0\n", "list"),
        ("d", True, b"", "folder"),
    ],
)
def test_detection_asks_the_converters_by_rank(path: str, is_dir: bool, head: bytes, expected: str) -> None:
    probe = Probe(path, is_dir, head)
    claims = [c.name for c in sorted(REGISTRY.values(), key=lambda c: c.rank) if c.detect and c.detect(probe)]
    assert claims[0] == expected, claims


def test_an_unknown_keyword_to_convert_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"convert\(\) got an unexpected keyword argument 'kyes'; did you mean 'keys'"):
        torchrecord.convert.convert(tmp_path / "x.npz", tmp_path / "o.tr", kyes=["a"])
    with pytest.raises(TypeError, match=r"did you mean 'shuffle'"):
        torchrecord.convert.convert(tmp_path / "x.npz", tmp_path / "o.tr", shufle=False)
