#!/usr/bin/env bash
# CI's docs leg: the documentation site builds from a fresh install of the docs extra alone.
#
# A new virtual environment gets torch==2.13.0 first (pinned: a bare torch can pull
# a multi-GB CUDA build), then `pip install -e '.[docs]'` and nothing else, and runs
# `mkdocs build --strict`: what a user's fresh install of the docs extra builds with, not the
# dev environment of the other legs. It works in a copy of the checkout's files (tracked and
# new, not ignored ones): an editable install writes torchrecord_lmdb.egg-info into the
# project, and the other legs install this checkout at the same time. Both go when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
COPY=$(mktemp -d)
VENV=$COPY/.venv-docs
trap 'rm -rf "$COPY"' EXIT
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} find {} -maxdepth 0 -type f -print0 \
    | tar --null -cf - -T - | tar -xf - -C "$COPY"
else  # not a git checkout: everything but virtual environments and build outputs
  tar --exclude='./.venv*' --exclude=./build --exclude=./site --exclude='*.egg-info' -cf - . | tar -xf - -C "$COPY"
fi

"$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --no-compile torch==2.13.0
(cd "$COPY" && python -m pip install -q --no-compile -e '.[docs]')
echo "docs leg: environment installed in ${SECONDS}s"
python -m pip list 2>/dev/null | grep -iE '^(mkdocs|mkdocs-material|mkdocstrings|mkdocstrings-python|griffelib) '
(cd "$COPY" && mkdocs build --strict -d "$COPY/site")
test -f "$COPY/site/api/index.html"
echo "docs leg: mkdocs build --strict passed in ${SECONDS}s"
