#!/usr/bin/env bash
# CI's second leg: the oldest supported dependencies, in a fresh virtual environment.
#
# Installs torch==2.13.0 first (explicitly: never a bare torch or a range, which can pull a
# multi-GB CUDA build), then the project (a regular, non-editable install) with every lower
# bound of setup.cfg's install_requires pinned exactly (scripts/oldest_constraints.py:
# protobuf 3.20.3, NumPy 1.24.0, ...), checks the installed copy from outside the checkout,
# and runs a fast subset of the tests: round trip, fast path, DataLoader with workers (fork),
# CLI, the file format, the protobuf module, the stream reader's record blocks, worker handover and
# StreamLoader. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-oldest
TESTS=(
  tests/test_roundtrip.py
  tests/store/test_fastread.py
  tests/read/test_dataloader.py
  tests/cli/test_cli.py
  tests/store/test_format.py
  tests/core/test_proto.py
  tests/read/test_record_block.py
  tests/read/test_ipc.py
  tests/streams/test_loader.py
)

rm -rf "$VENV" build
"$PY" -m venv "$VENV"
. "$VENV/bin/activate"
# --no-compile: byte-compiling all of torch up front costs more than the tests use.
python -m pip install -q --no-compile torch==2.13.0
python scripts/oldest_constraints.py > "$VENV/constraints.txt"
python -m pip install -q --no-compile -c "$VENV/constraints.txt" '.[test,images,hdf5,progress]'
rm -rf build
echo "oldest leg: environment installed in ${SECONDS}s"
python scripts/versions.py --label "oldest leg" --expect "$VENV/constraints.txt"

# The installed copy, from outside the checkout: a round trip through the library and the command.
work=$(mktemp -d)
(cd "$work" && python - <<'PY'
import torchrecord

assert "site-packages" in torchrecord.__file__, torchrecord.__file__
torchrecord.write_record([(i, b"x" * i) for i in range(5)], "t.tr", progress=False)
assert sorted(sample[0] for sample in torchrecord.RecordDataset("t.tr")) == list(range(5))
PY
torchrecord info t.tr > /dev/null)
rm -rf "$work"

# The spawn and forkserver DataLoader variants (a minute or more: each worker imports torch
# afresh) only run in the main leg; the fork ones run here.
python -m pytest -q -p no:cacheprovider -n 2 -k "not spawn and not forkserver" "${TESTS[@]}" "$@"
