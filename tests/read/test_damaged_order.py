"""Issue 20, finding 2: a duplicated leaf page or a misdirected node pointer in the records database
never makes a reader duplicate or skip samples silently (without check="checksums", the default).

Before the bulk key check, ``RecordDataset`` yielded 400 samples of which 387 were distinct, every
epoch, also through DataLoader workers. Each read path runs in a forked child (a damaged file must not
take the test process down) and may either give every sample exactly once or raise a torchrecord error.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import torchrecord
from tests.lmdb_mutations import Base, Mutation, Skip, _duplicate_leaf, _misdirected_pointer, build_bases, canonical
from torchrecord._check.isolate import run_in_child
from torchrecord.errors import TorchRecordError


@pytest.fixture(scope="module")
def fixed_base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    bases = build_bases(str(tmp_path_factory.mktemp("bases")))
    return next(b for b in bases if b.name == "fixed")  # 400 samples, one per record: many leaf pages


def _records_mutant(base: Base, mutation: Any, seed: int) -> tuple[bytes, str]:
    """``base`` with one ``mutation`` that lands in the records database (not crc32, not metadata)."""
    rng = random.Random(seed)
    for _ in range(500):
        m = Mutation(base, rng)
        try:
            description = mutation(m)
        except Skip:
            continue
        if "records" in description and bytes(m.data) != base.data:
            return bytes(m.data), description
    raise AssertionError("no mutation of the records database found")


def _outcome(read: Any, path: str, expected: Counter[Any]) -> str:
    """'correct' (every sample once), 'error' (a torchrecord error) or what went wrong, in words."""
    try:
        got = Counter(canonical(s) for s in read(path))
    except TorchRecordError:
        return "error"
    except Exception as exc:  # reported: the test fails on it
        return f"other: {type(exc).__name__}: {exc}"
    if got == expected:
        return "correct"
    return f"wrong: {sum(got.values())} samples, {len(got)} distinct, {len(expected)} expected"


def _record_file(path: str) -> list[Any]:
    return list(torchrecord.RecordFile(path))


def _random_access(path: str) -> list[Any]:
    rf = torchrecord.RecordFile(path)
    return [rf[i] for i in range(len(rf))]


def _dataset(path: str) -> list[Any]:
    return list(torchrecord.RecordDataset(path, seed=3))


def _dataset_batches(path: str) -> list[Any]:
    out: list[Any] = []
    for images, labels in torchrecord.RecordDataset(path, batch_size=64, seed=3):
        out += list(zip(images.unbind(0), labels.tolist()))
    return out


def _dataloader_workers(path: str) -> list[Any]:
    ds = torchrecord.RecordDataset(path, seed=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    batches = iter(loader)
    try:
        return list(batches)
    finally:
        # this runs in an isolated child that leaves with os._exit: stop and join the workers first. A
        # worker still starting when its parent died took init (PID 1) for its parent, so torch's
        # watchdog never saw the death, and it waited for work forever (orphans seen after full runs)
        batches._shutdown_workers()  # type: ignore[attr-defined]


READS = [_record_file, _random_access, _dataset, _dataset_batches, _dataloader_workers]


@pytest.mark.parametrize("mutation", [_duplicate_leaf, _misdirected_pointer], ids=["duplicate_leaf", "misdirected"])
@pytest.mark.parametrize("seed", range(3))
def test_damaged_record_order_is_an_error_never_wrong_samples(
    fixed_base: Base, tmp_path: Path, mutation: Any, seed: int
) -> None:
    data, description = _records_mutant(fixed_base, mutation, seed)
    path = tmp_path / "damaged.tr"
    path.write_bytes(data)
    outcomes = {}
    for read in READS:
        child = run_in_child(_outcome, read, str(path), fixed_base.counts, timeout=120)
        outcomes[read.__name__] = child.value if child.status == "returned" else f"{child.status}"
    bad = {name: o for name, o in outcomes.items() if o not in ("correct", "error")}
    assert not bad, f"{description}: {bad}"
    # the damage is real: at least one whole pass over the records notices it
    assert "error" in outcomes.values(), f"{description}: {outcomes}"
