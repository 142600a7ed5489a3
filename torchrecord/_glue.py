"""DataLoader glue: find the DataLoader that asked a dataset for its length.

``len(loader)`` of a DataLoader over an IterableDataset is computed from
``len(dataset)`` and the loader's batch size, in the main process, before any
worker starts. That is the moment a wrong count does harm (a schedule's total
steps, a progress bar), so the dataset looks at who asked, to warn then.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["calling_loader"]


def calling_loader(dataset: Any) -> Any:
    """The DataLoader whose ``__len__`` is calling ``dataset.__len__``, or None.

    Recognised by shape (a ``__len__`` frame whose ``self`` has ``.dataset is
    dataset``), so torch's DataLoader and torchdata's StatefulDataLoader both
    count; anything else (a plain ``len(ds)``) gives None.
    """
    frame = sys._getframe(2)  # 0: here, 1: dataset.__len__, 2: its caller
    try:
        if frame.f_code.co_name != "__len__":
            return None
        loader = frame.f_locals.get("self")
        return loader if getattr(loader, "dataset", None) is dataset else None
    finally:
        del frame
