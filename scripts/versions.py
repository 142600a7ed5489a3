"""Print the versions this environment runs torchrecord with; optionally check them.

    python scripts/versions.py [--label NAME] [--expect CONSTRAINTS]

With ``--expect``, every ``name==version`` line of the constraints file must match
the installed distribution (a local tag such as ``+cpu`` is ignored); exit 1 names
the first that does not.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

DISTRIBUTIONS = ("torch", "numpy", "protobuf", "lmdb", "msgpack")


def _release(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13), '1.24' -> (1, 24): numeric parts, trailing zeros dropped."""
    parts = [int(p) for p in text.split("+")[0].split(".") if p.isdigit()]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="environment")
    parser.add_argument("--expect", type=Path, help="constraints file of name==version lines")
    args = parser.parse_args(argv)

    from google.protobuf.internal import api_implementation

    installed = {name: version(name) for name in DISTRIBUTIONS}
    listed = ", ".join(f"{name} {v}" for name, v in installed.items())
    print(f"{args.label}: Python {sys.version.split()[0]}, {listed} (protobuf backend: {api_implementation.Type()})")
    if args.expect is not None:
        for line in args.expect.read_text().split("\n"):
            if not line.strip():
                continue
            name, pin = (part.strip() for part in line.split("=="))
            if _release(version(name)) != _release(pin):
                print(f"{args.label}: {name} {version(name)} is installed, {pin} was expected", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
