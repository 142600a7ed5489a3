"""Every public property and method has a docstring, every argument of a public function is documented,
and every install line of the README and the docs installs this project."""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import torchrecord

PUBLIC = [n for n in torchrecord.__all__ if n != "__version__"]
#: The write options are documented once, in these TypedDicts; a function taking them refers to them.
OPTIONS_DOC = "".join(
    inspect.getdoc(t) or "" for t in (torchrecord.WriteOptions, torchrecord.WriterOptions, torchrecord.StoreOptions)
)
ROOT = Path(__file__).resolve().parent.parent
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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


# -- install lines: every `pip install` of the README and the docs installs this project ---------
#: "torchrecord" on PyPI is an unrelated 2018 project; this one installs from a checkout (``-e .``)
#: or, once published, as torchrecord-lmdb
_UNRELATED = "torchrecord"
_INSTALL = re.compile(r"pip install\s+([^`#\n]*)")
_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-t"}


def pip_install_targets(text: str) -> list[tuple[int, str]]:
    """(line number, requirement) of every package a ``pip install`` command of ``text`` names."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for command in _INSTALL.finditer(line):
            try:
                words = shlex.split(command.group(1))
            except ValueError:  # an unbalanced quote: the command runs on; take the words as written
                words = command.group(1).split()
            skip = False
            for word in words:
                if word in ("&&", "||", ";", "|"):
                    break
                if skip or word.startswith("-"):
                    skip = word in _OPTIONS_WITH_VALUE
                    continue
                found.append((number, word))
    return found


def names_the_unrelated_package(requirement: str) -> bool:
    """True for a requirement of PyPI's ``torchrecord`` (any extras, version or quotes), not torchrecord-lmdb."""
    name = re.match(r"[A-Za-z0-9._-]*", requirement.strip("'\""))
    return name is not None and re.sub(r"[-_.]+", "-", name.group(0)).lower() == _UNRELATED


@pytest.mark.parametrize("page", DOC_PAGES, ids=[str(p.relative_to(ROOT)) for p in DOC_PAGES])
def test_install_lines_install_this_project(page: Path) -> None:
    """No `pip install` line of the README or the docs names PyPI's unrelated ``torchrecord``."""
    wrong = [
        f"{page.name}:{n}: {req}"
        for n, req in pip_install_targets(page.read_text(encoding="utf-8"))
        if names_the_unrelated_package(req)
    ]
    assert not wrong, (
        f"these install PyPI's unrelated 'torchrecord' (use -e . in a checkout, or torchrecord-lmdb): {wrong}"
    )


def test_the_install_line_check_can_fail() -> None:
    """Control: PyPI's torchrecord is caught with or without extras and versions; this project's lines pass."""
    bad = [
        "pip install torchrecord",
        "pip install 'torchrecord[hf,s3,lightning]' pillow   # in a checkout: pip install -e '.[hf]'",
        "`pip install -U torchrecord==0.1.1`",
        'pip install -q "torchrecord>=0.1" numpy',
        "python -m pip install --no-deps TorchRecord",
    ]
    good = [
        "pip install -e '.[hf,s3,lightning]' pillow",
        "pip install torchrecord-lmdb 'torchrecord-lmdb[images]'",
        "pip wheel --no-deps . && pip install torchrecord_lmdb-*.whl",
        "pip install -c constraints.txt torch==2.13.0",
        "pip install 'moto[server]>=5' \"boto3==$(python -c 'import botocore; print(botocore.__version__)')\"",
    ]
    assert [any(names_the_unrelated_package(r) for _, r in pip_install_targets(line)) for line in bad] == [True] * 5
    assert not [r for line in good for _, r in pip_install_targets(line) if names_the_unrelated_package(r)]
    assert [r for _, r in pip_install_targets(good[0])] == [".[hf,s3,lightning]", "pillow"]
    assert [r for _, r in pip_install_targets(good[3])] == ["torch==2.13.0"]


# -- the docs extra builds the site from a fresh install, and CI builds it so ----------------------
def _docs_extra() -> list[str]:
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return [line.strip() for line in config["options.extras_require"]["docs"].splitlines() if line.strip()]


def test_the_docs_extra_is_bounded_to_what_ci_builds_with() -> None:
    """mkdocs, material, mkdocstrings and griffe have upper bounds (--strict fails on any new warning)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    extra = {Requirement(r).name: Requirement(r).specifier for r in _docs_extra()}
    for name in ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "griffelib"):
        assert name in extra, f"the docs extra lacks {name}"
        assert any(spec.operator in ("<", "<=", "==") for spec in extra[name]), f"{name} has no upper bound"
    # from 9.7.2 on, material prints a notice (MkDocs 2.0, then its end of life) on every build
    assert Version("9.7.2") not in extra["mkdocs-material"] and Version("9.7.1") in extra["mkdocs-material"]


def test_ci_builds_the_site_from_a_fresh_install_of_the_docs_extra() -> None:
    """scripts/test-docs.sh: a new venv, torch pinned first, then only the docs extra, then mkdocs build --strict."""
    script = (ROOT / "scripts" / "test-docs.sh").read_text(encoding="utf-8")
    steps = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    venv = next(i for i, s in enumerate(steps) if "-m venv" in s)
    torch = next(i for i, s in enumerate(steps) if "pip install" in s and "torch==2.13.0" in s)
    extra = next(i for i, s in enumerate(steps) if "pip install" in s and "-e '.[docs]'" in s)
    build = next(i for i, s in enumerate(steps) if "mkdocs build --strict" in s)
    assert venv < torch < extra < build
    assert [s for s in steps if "pip install" in s] == [steps[torch], steps[extra]], "nothing else is installed"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    leg = re.search(r"\(\s*bash scripts/test-docs\.sh.*?\)\s*&\s*\ndocs=\$!", ci, re.S)
    assert leg, ".ci/run does not run the docs leg in the background, beside the others"
    assert 'wait "$docs"' in ci


def test_the_pages_say_what_a_new_user_trips_over() -> None:
    """Issue 41, item 12: grayscale images decode to 3 channels; a StatefulDataLoader state across worker counts."""
    hf = (ROOT / "docs" / "huggingface.md").read_text(encoding="utf-8")
    assert "grayscale image" in hf and "3 channels" in hf and 'mode="L"' in hf
    resuming = (ROOT / "docs" / "resuming.md").read_text(encoding="utf-8")
    assert "AssertionError" in resuming and "torchrecord.RecordLoader" in resuming
    writing = (ROOT / "docs" / "writing.md").read_text(encoding="utf-8")
    assert "A list of lists is a structure" in writing
