"""Shared fixtures: real record sets under tmp_path, and the --runslow switch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import torchrecord


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


class IndexedImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """n samples of (uint8[3, size, size] whose first pixels encode i, label i).

    Picklable (module level), so it works in spawn workers too.
    """

    def __init__(self, n: int, size: int = 4) -> None:
        self.n = n
        self.size = size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = torch.full((3, self.size, self.size), i % 251, dtype=torch.uint8)
        return image, i


@pytest.fixture
def make_record(tmp_path: Path) -> Callable[..., str]:
    """Write a record set under tmp_path and return its path: make_record(dataset, **kw)."""
    counter = iter(range(10**6))

    def make(dataset: Any, name: str | None = None, **kwargs: Any) -> str:
        path = tmp_path / (name or f"set{next(counter)}.tr")
        kwargs.setdefault("progress", False)
        torchrecord.write_record(dataset, path, **kwargs)
        return str(path)

    return make
