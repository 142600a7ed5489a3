"""Regenerate torchrecord/_proto/torchrecord_pb2.py (and its .pyi stub) from proto/.

Needs the dev extra (grpcio-tools, mypy-protobuf). Run from anywhere:
    python scripts/gen_proto.py [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO_NAME = "torchrecord.proto"
PACKAGE_DIR = ROOT / "torchrecord" / "_proto"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) and return the generated files in out_dir."""
    with tempfile.TemporaryDirectory() as work:
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={work}",
            f"--mypy_out={work}",
            str(PROTO_DIR / PROTO_NAME),
        ]
        subprocess.run(cmd, check=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in ("torchrecord_pb2.py", "torchrecord_pb2.pyi"):
            target = out_dir / name
            shutil.copyfile(Path(work) / name, target)
            written.append(target)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
