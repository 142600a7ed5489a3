"""The CLI tests' shared fixture: ``run(*argv)`` calls ``torchrecord.cli.main`` in this process."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from torchrecord.cli import main

#: run(*argv) -> (exit code, stdout, stderr)
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """run(*argv) -> (exit code, stdout, stderr) of main(argv)."""

    def call(*argv: str | os.PathLike[str]) -> tuple[int, str, str]:
        code = main([os.fspath(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call
