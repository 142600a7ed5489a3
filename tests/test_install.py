"""What the install promises stays in one place: setup.cfg's ranges, the README, the hints, CI's oldest leg."""

from __future__ import annotations

import configparser
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import torchrecord
from torchrecord._core.extras import EXTRAS, install_hint

ROOT = Path(__file__).resolve().parent.parent


def _config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def _lines(value: str) -> list[str]:
    return [line.split("#")[0].strip() for line in value.split("\n") if line.split("#")[0].strip()]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_install_hints_match_the_extras() -> None:
    extras = _config()["options.extras_require"]
    for extra, requirement in EXTRAS.items():
        assert _lines(extras[extra]) == [requirement], extra
        assert requirement in _lines(extras["dev"]), f"the dev extra lacks {requirement}"
    hint = "pip install 'pillow>=9' (or, in a torchrecord checkout: pip install -e '.[images]')"
    assert install_hint("images") == hint


def test_no_hint_names_the_unpublished_distribution() -> None:
    """torchrecord-lmdb is not on PyPI: no message may tell users to pip install it by name."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in Path(torchrecord.__file__).parent.rglob("*.py")
        if re.search(r"pip install\s+['\"]?torchrecord-lmdb", path.read_text())
    ]
    assert not offenders


def test_oldest_constraints_pin_every_lower_bound() -> None:
    requirements = _lines(_config()["options"]["install_requires"])
    pins = _script("oldest_constraints").constraints()
    assert [pin.split("==")[0] for pin in pins] == [re.split(r"[<>=!~;\s]", r)[0] for r in requirements]
    by_name = dict(pin.split("==") for pin in pins)
    assert by_name["torch"] == "2.13.0"
    assert by_name["protobuf"] == "3.20.3"
    assert by_name["numpy"] == "1.24"


def test_oldest_constraints_refuse_a_requirement_without_lower_bound(tmp_path: Path) -> None:
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[options]\ninstall_requires =\n    numpy>=1.24\n    lmdb\n")
    with pytest.raises(ValueError, match="'lmdb' has no lower bound"):
        _script("oldest_constraints").constraints(cfg)


def test_readme_states_the_declared_ranges() -> None:
    readme = (ROOT / "README.md").read_text()
    for requirement in _lines(_config()["options"]["install_requires"]):
        assert f"`{requirement}`" in readme, f"README's install section does not state {requirement}"
    assert f"`{_config()['options']['python_requires']}`" in readme, "README does not state python_requires"


def test_type_checks_and_lint_target_the_oldest_python() -> None:
    oldest = _config()["options"]["python_requires"].removeprefix(">=")
    assert _config()["mypy"]["python_version"] == oldest
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'target-version = "py{oldest.replace(".", "")}"' in pyproject
