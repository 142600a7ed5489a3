"""A shard file checked against its manifest entry: the claims readers rely on before and when it is opened.

Readers size their index arrays by the manifest's counts before any shard is read and never
open a shard whose count is 0, so a sharded set checks each shard's size against its entry when
the manifest is read, opens the shards that claim no samples at once (local and remote sets
alike), and checks every shard's identity, counts, packing and place when it is first opened.
"""

from __future__ import annotations

import os
from typing import Any

from torchrecord._shards.manifest import MIN_RECORD_BYTES
from torchrecord._store.record_file import RecordFile
from torchrecord.errors import FormatError

__all__ = ["check_shard", "check_shard_file"]


def check_shard_file(entry: dict[str, Any], s: int, path: str, per_sample: int) -> None:
    """Check a local shard file's size against its manifest entry's claims before the set relies on them.

    A count that cannot fit in the file's actual size is refused here (readers size
    index arrays by the counts before any shard is opened); a missing file is left
    to the shard's opening, which names it.
    """
    try:
        actual = os.stat(path).st_size
    except (OSError, ValueError):
        return
    if entry["records"] * MIN_RECORD_BYTES > actual or entry["count"] * per_sample > actual:
        raise FormatError(
            f"{path}: shard {s} claims {entry['count']} samples in {entry['records']} records, but the file "
            f"holds {actual} bytes: the manifest does not describe this file; run torchrecord.finalize_shards again"
        )


def check_shard(rf: RecordFile, s: int, manifest: dict[str, Any]) -> None:
    """FormatError unless ``rf`` is the file shard ``s`` of the manifest lists: set_id, counts, packing, size, place."""
    entry = manifest["shards"][s]
    n = len(manifest["shards"])
    meta = rf.metadata
    place: dict[str, Any] = meta["shard"] if isinstance(meta.get("shard"), dict) else {}
    size = os.path.getsize(rf.path)
    said_per_record = manifest.get("samples_per_record", 1)  # an empty shard packs nothing: any packing fits
    found = {
        "set_id": rf.set_id,
        "count": len(rf),
        "records": rf.num_records,
        "bytes": size,
        "samples_per_record": rf.samples_per_record if len(rf) else said_per_record,
        "shard": [place.get("index", s), place.get("of", n)],
    }
    said = {
        "set_id": entry["set_id"],
        "count": entry["count"],
        "records": entry["records"],
        "bytes": entry["bytes"],
        "samples_per_record": said_per_record,
        "shard": [s, n],
    }
    differ = [k for k in said if found[k] != said[k]]
    if differ:
        detail = "; ".join(f"{k}: the file has {found[k]}, the manifest says {said[k]}" for k in differ)
        raise FormatError(
            f"{rf.path}: shard {s} is not the file the manifest lists ({detail}): it was rewritten after the set "
            "was finalized, or the manifest was edited; run torchrecord.finalize_shards again"
        )
