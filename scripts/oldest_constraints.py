"""Print pip constraints that pin every dependency of setup.cfg at its lower bound.

scripts/test-oldest.sh installs the project with these, so the CI leg tests exactly
the minimums that install_requires declares (``numpy>=1.24`` becomes ``numpy==1.24``).
torch is the exception: it is pinned to TORCH, the only build this project tests.
"""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"
_LOWER = re.compile(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)")


def constraints(setup_cfg: Path = ROOT / "setup.cfg") -> list[str]:
    """One ``name==version`` line per install_requires entry (torch: TORCH)."""
    config = configparser.ConfigParser()
    config.read(setup_cfg)
    lines = []
    for requirement in config["options"]["install_requires"].split("\n"):
        requirement = requirement.split("#")[0].strip()
        if not requirement:
            continue
        match = _LOWER.match(requirement)
        if match is None:
            raise ValueError(f"{setup_cfg}: {requirement!r} has no lower bound (name>=version)")
        name, version = match.groups()
        lines.append(f"{name}=={TORCH if name == 'torch' else version}")
    return lines


def main() -> int:
    sys.stdout.write("".join(line + "\n" for line in constraints()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
