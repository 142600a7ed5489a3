"""scripts/demo.sh installs what its job needs (not the dev extra), and the job's time split adds up.

The demo's job is examples/compare_conventional.py; its "where the time goes" lines give each
case's decoding as CPU time measured in the processes that decode, and its share of the epoch
per process, which cannot exceed the epoch.
"""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scripts" / "demo.sh"
JOB = [ROOT / "examples" / "compare_conventional.py", ROOT / "examples" / "_compare_support.py"]
#: the distribution of each third-party import of the job
DISTRIBUTION = {"torch": "torch", "numpy": "numpy", "PIL": "pillow", "tqdm": "tqdm", "torchrecord": "torchrecord-lmdb"}


def _steps() -> list[str]:
    return [
        line.strip() for line in DEMO.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _third_party_imports() -> set[str]:
    local = {"_compare_support"}
    names: set[str] = set()
    for path in JOB:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names - local if n not in sys.stdlib_module_names and n != "__future__"}


def _installed_by(extras: list[str]) -> set[str]:
    """The distributions install_requires and ``extras`` of setup.cfg install."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    for extra in extras:
        lines += config["options.extras_require"][extra].splitlines()
    names = {re.split(r"[^A-Za-z0-9._-]", line.strip(), maxsplit=1)[0].lower() for line in lines if line.strip()}
    return names | {"torchrecord-lmdb"}


def test_the_demo_installs_torch_first_then_a_small_extra_in_its_own_venv() -> None:
    steps = _steps()
    text = "\n".join(steps)
    assert "setup-env.sh" not in text and "[dev]" not in text, "the demo must not install the dev extra"
    installs = [s for s in steps if "pip install" in s]
    assert len(installs) == 2, installs
    assert installs[0].endswith("pip install -q --no-compile torch==2.13.0"), installs
    extras = re.search(r"-e '\.\[([a-z,]+)\]'", installs[1])
    assert extras, installs[1]
    assert "VENV=.venv-demo" in steps
    # every package the job imports comes with torch, install_requires or those extras
    needed = {DISTRIBUTION[name] for name in _third_party_imports()}
    assert needed <= _installed_by(extras.group(1).split(",")), (needed, extras.group(1))
    assert not {"dev", "test", "docs", "s3", "hf", "dask", "ray", "lightning"} & set(extras.group(1).split(","))


def test_the_job_imports_are_all_known() -> None:
    """Control: a new third-party import of the job shows up here (and must be installed by the demo)."""
    assert _third_party_imports() == set(DISTRIBUTION)


@pytest.mark.timeout(600)
def test_the_job_says_where_the_time_goes_within_the_epoch(tmp_path: Path) -> None:
    """A small run: decoding is CPU measured where it runs, and no share of an epoch exceeds 100%."""
    small = ["--count", "48", "--size", "16", "--workers", "0", "2", "--cache", "warm"]
    proc = subprocess.run(
        [sys.executable, str(JOB[0]), *small, "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.split("where the time goes", 1)[1].splitlines()
    cases = [line for line in lines if re.match(r"\s+warm (conventional|torchrecord) w=\d", line)]
    assert len(cases) == 4, lines
    assert "measured in the processes that decode" in lines[0]
    for line in cases:
        shares = [int(p) for p in re.findall(r"\((\d+)% of (?:it|the epoch)", line)]
        assert len(shares) == 2 and all(0 <= p <= 100 for p in shares), line
        decoding = re.search(r"decoding ([\d.]+) s of CPU", line)
        assert decoding and float(decoding.group(1)) > 0, line  # both loaders decode every image (stored encoded)
    assert any("over its 2 workers" in line and "per worker" in line for line in cases), cases
