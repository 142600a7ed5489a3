"""Write attempts: which run of write_shard a shard belongs to, so a finalized set holds one run's shards.

Every shard, its note and the manifest record the attempt that wrote them, and
``finalize_shards`` publishes a set only when every shard is of one attempt (a shard of another
is named, to be written again). The attempt of a writer is, first found:

1. ``attempt=`` as given to ``write_shard``;
2. ``$TORCHRECORD_WRITE_ATTEMPT`` (e.g. a SLURM job id, a Ray job's name);
3. under ``torch.distributed``, when ``write_shard`` takes its shard and shard count from the
   rank and world size: a fresh random id drawn by rank 0 and broadcast (every rank calls
   ``write_shard``, as the documented pattern does);
4. otherwise derived from the plan (shard count, seed, source, total, options) and, for a
   rewrite (``overwrite=True`` of a finalized set), the finalized set's id: every writer of one
   rewrite derives the same attempt, which differs from the set it replaces.

Without 1-3, writers of one plan cannot tell an earlier, unfinished attempt's shard from this
run's (they derive the same attempt); give ``attempt=`` to tell them apart (docs/shards.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from torchrecord.errors import ArgumentError

__all__ = ["ATTEMPT_ENV", "Attempt", "attempt_of", "check_attempt", "chosen_attempt", "resolve_attempt"]

ATTEMPT_ENV = "TORCHRECORD_WRITE_ATTEMPT"
_VALID = re.compile(r"^[0-9A-Za-z_.:-]{1,64}$")


@dataclass(frozen=True)
class Attempt:
    """A writer's attempt id, and whether the user chose it (given, or from the environment or the run)."""

    id: str
    chosen: bool


def check_attempt(value: Any, where: str) -> str:
    """``value`` if it is an attempt id (1-64 letters, digits, ``_ . : -``), else ArgumentError naming ``where``."""
    if not isinstance(value, str) or not _VALID.match(value):
        raise ArgumentError(
            f"{where}: attempt {str(value)[:80]!r} is not an attempt id (1 to 64 letters, digits, '_', '.', ':', '-')"
        )
    return value


def chosen_attempt(given: str | None, from_dist: bool) -> str | None:
    """The attempt id the user or the run chose (steps 1-3 of the module's docstring), else None.

    Under torch.distributed this is a collective (rank 0 broadcasts), so it runs before any check
    that could fail on one rank and not on another.
    """
    if given is not None:
        return check_attempt(given, "write_shard")
    env = os.environ.get(ATTEMPT_ENV, "").strip()
    if env:
        return check_attempt(env, f"${ATTEMPT_ENV}")
    if from_dist:
        box = [os.urandom(8).hex() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return check_attempt(box[0], "torch.distributed rank 0")
    return None


def resolve_attempt(chosen: str | None, plan: dict[str, Any], rewrites: str | None) -> Attempt:
    """This writer's attempt: the chosen one, else one derived from the plan and the set a rewrite replaces.

    Args:
        chosen: what :func:`chosen_attempt` found.
        plan: the writer's plan (what every shard of the set shares), for the derived id.
        rewrites: the set_id of the finalized set an ``overwrite=True`` writer replaces, else None.
    """
    if chosen is not None:
        return Attempt(chosen, True)
    text = json.dumps({"plan": plan, "rewrites": rewrites}, sort_keys=True, default=str)
    return Attempt("plan-" + hashlib.sha256(text.encode()).hexdigest()[:24], False)


def attempt_of(meta: dict[str, Any]) -> str | None:
    """The attempt a shard's metadata records (None: written by a torchrecord without attempts)."""
    info = meta.get("shard")
    value = info.get("attempt") if isinstance(info, dict) else None
    return value if isinstance(value, str) else None
