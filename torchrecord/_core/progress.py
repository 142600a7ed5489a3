"""Progress bars for long loops: tqdm when it is installed and wanted, else nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, progress: bool | None, desc: str) -> Any:
    """A tqdm bar counting samples (``progress=None``: only on a terminal), or a no-op bar."""
    if progress is False:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="sample", disable=None if progress is None else False)
