"""docs/ARCHITECTURE.md names every module of the package, and names no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torchrecord"
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
#: Package markers (their docstring says what the package holds); the page names the packages instead.
SKIPPED = {"__init__.py"}


def modules() -> set[str]:
    """Every module as the page writes it: its path below torchrecord/, e.g. ``_read/dataset.py``."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name in SKIPPED and rel != "convert/__init__.py" and rel != "__init__.py":
            continue
        found.add(rel)
    return found


def named(text: str) -> set[str]:
    """The package's module paths written in backquotes on the page (``torchrecord/`` prefix optional)."""
    paths = {m.removeprefix("torchrecord/") for m in re.findall(r"`([\w/]+\.py)`", text)}
    return {p for p in paths if not p.startswith(("tests/", "scripts/"))}


def test_every_module_is_named() -> None:
    missing = modules() - named(PAGE.read_text(encoding="utf-8"))
    assert not missing, f"docs/ARCHITECTURE.md does not name: {sorted(missing)}"


def test_no_module_named_is_gone() -> None:
    gone = {m for m in named(PAGE.read_text(encoding="utf-8")) if not (PACKAGE / m).exists()}
    assert not gone, f"docs/ARCHITECTURE.md names modules that do not exist: {sorted(gone)}"


def test_the_check_can_fail() -> None:
    """Control: a page without a module is caught, and the real package is walked."""
    assert "_read/dataset.py" in modules()
    assert "_read/dataset.py" not in named("`_write/writer.py` only")
