"""One shard's body: its part of the source, the metadata that places it in its set, its note.

A map-style source is the whole data set, the same in every writer: shard ``i`` writes positions
``[i*N//n, (i+1)*N//n)`` of the one global permutation. An iterable source is this writer's own
part, shuffled with a seed derived from ``(seed, shard)``. The shard's ``shard`` metadata records
its place, its plan and its write attempt; its note (``shard-...tr.json``) records what
``finalize_shards`` needs without reading the shard: size, SHA-256, count, ``set_id``, attempt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from torchrecord._storage.stamps import file_digest
from torchrecord._store.record_file import RecordFile
from torchrecord._write.attempts import Attempt
from torchrecord._write.settings import WriteSettings
from torchrecord._write.shard_plan import plan_options
from torchrecord._write.sources import is_map_style
from torchrecord._write.writer import write_source

__all__ = ["ShardBody"]


@dataclasses.dataclass
class ShardBody:
    """What one writer writes: the source, its settings, its slice, its ``shard`` metadata (``info``)."""

    dataset: Any
    settings: WriteSettings
    positions: slice | None
    info: dict[str, Any]
    digested: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, dataset: Any, settings: WriteSettings, shard: int, num_shards: int) -> ShardBody:
        """Shard ``shard`` of ``num_shards`` of ``dataset``: its slice (map-style) or its own shuffle (iterable)."""
        seed = settings.seed
        if is_map_style(dataset):
            total = len(dataset)
            lo, hi = shard * total // num_shards, (shard + 1) * total // num_shards
            info = {"index": shard, "of": num_shards, "first": lo, "total": total, "seed": seed, "source": "map"}
            positions: slice | None = slice(lo, hi)
        else:
            info = {"index": shard, "of": num_shards, "first": None, "total": None, "seed": seed, "source": "iterable"}
            positions = None
            # each writer shuffles its own part, with its own stream of the seed
            mixed = np.random.SeedSequence([seed, shard, 0x73686172]).generate_state(1)[0]
            settings = dataclasses.replace(settings, seed=int(mixed))
        info["options"] = plan_options(settings)
        return cls(dataset, settings, positions, info)

    def join(self, attempt: Attempt) -> None:
        """Record the write attempt this shard belongs to (none for a set of a torchrecord without attempts)."""
        if attempt.id is not None:
            self.info["attempt"] = attempt.id

    def digest(self, path: str) -> dict[str, Any]:
        """The SHA-256 and size of the finished file ``path`` (kept for the note)."""
        self.digested["sha256"], self.digested["bytes"] = file_digest(path)
        return self.digested

    def write(self, target: str, before_publish: Callable[[str], None]) -> RecordFile:
        """Write the shard at ``target`` (replacing an earlier one); ``before_publish`` runs before the rename."""
        return write_source(
            self.dataset,
            target,
            dataclasses.replace(self.settings, overwrite=True),  # a shard written again replaces the earlier one
            positions=self.positions,
            extra={"shard": self.info},
            before_publish=before_publish,
        )

    def note(self, rf: RecordFile) -> dict[str, Any]:
        """The note of the shard just written: this write's identity and count, not read back from the path."""
        note = {
            "shard": self.info["index"],
            "num_shards": self.info["of"],
            "set_id": rf._pin,
            "count": rf.write_summary.count,
            **self.digested,
        }
        if "attempt" in self.info:
            note["attempt"] = self.info["attempt"]
        return note
