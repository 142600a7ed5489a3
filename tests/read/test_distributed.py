"""A real two-process torch.distributed (gloo) run: ranks split an epoch exactly once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset

COUNT = 101  # odd: two ranks must pad one sample or drop one
WORLD = 2
SCENARIOS: dict[str, dict[str, Any]] = {
    "pad": {"drop_last": False},
    "drop": {"drop_last": True},
    "batches_pad": {"drop_last": False, "batch_size": 8},
    "batches_drop": {"drop_last": True, "batch_size": 8},
}


def _labels(items: Any, batched: bool) -> list[int]:
    if batched:
        return [int(x) for _, ys in items for x in ys]
    return [int(label) for _, label in items]


def _rank_main(rank: int, init_file: str, path: str, out_dir: str) -> None:
    """One rank: detect rank/world from torch.distributed, read, gather, write a report."""
    early = RecordDataset(path, shuffle_buffer=16, seed=2)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        early.set_epoch(1)
        report: dict[str, Any] = {"rank": dist.get_rank(), "early": _labels(early, False)}
        for name, kwargs in SCENARIOS.items():
            ds = RecordDataset(path, shuffle_buffer=16, seed=2, **kwargs)  # no rank/world given
            ds.set_epoch(1)
            batched = "batch_size" in kwargs
            direct = _labels(ds, batched)
            loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
            through_loader = _labels(loader, batched)
            gathered: list[Any] = [None] * WORLD
            dist.all_gather_object(gathered, direct)
            report[name] = {
                "len": len(ds),
                "items": len(list(ds)),
                "direct": direct,
                "loader": through_loader,
                "gathered": gathered,
            }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_split_the_epoch(tmp_path: Path) -> None:
    path = tmp_path / "dist.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, progress=False)
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=WORLD, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [r["rank"] for r in reports] == [0, 1]
    for name, kwargs in SCENARIOS.items():
        per_rank = [r[name] for r in reports]
        direct = [p["direct"] for p in per_rank]
        # every rank saw the same gathered lists, in rank order
        assert per_rank[0]["gathered"] == per_rank[1]["gathered"] == direct, name
        # one worker per rank reads exactly what the rank reads in-process
        assert [p["loader"] for p in per_rank] == direct, name
        counts = [len(d) for d in direct]
        assert counts[0] == counts[1], f"{name}: ranks yield {counts}"
        assert per_rank[0]["len"] == per_rank[1]["len"] == per_rank[0]["items"], name
        total = sum(counts)
        seen = direct[0] + direct[1]
        if kwargs["drop_last"]:
            expected = COUNT // WORLD
            if "batch_size" in kwargs:
                expected = expected // kwargs["batch_size"] * kwargs["batch_size"]
            assert counts[0] == expected, name
            assert_exactly_once(seen, COUNT, drop=COUNT - total)
        else:
            assert counts[0] == -(-COUNT // WORLD), name
            assert_exactly_once(seen, COUNT, pad=total - COUNT)
    assert set(reports[0]["drop"]["direct"]).isdisjoint(reports[1]["drop"]["direct"])
    # a dataset made before init_process_group picks up rank and world when it is used
    assert [r["early"] for r in reports] == [r["pad"]["direct"] for r in reports]


def _save_rank_main(rank: int, init_file: str, path: str, out_dir: str) -> None:
    """One of two gloo ranks: 2 StatefulDataLoader workers, 5 batches, then gather every rank's loader state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = RecordDataset(path, batch_size=4, shuffle_buffer=8, seed=5)
        ds.set_epoch(2)
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        it = iter(loader)
        seen = [int(x) for _ in range(5) for x in next(it)[1]]
        state = loader.state_dict()
        del it
        gathered: list[Any] = [None] * WORLD
        dist.all_gather_object(gathered, state)
        with open(os.path.join(out_dir, f"save{rank}.json"), "w") as f:
            json.dump({"seen": seen, "states": gathered}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_elastic_resume_from_two_gloo_ranks_on_one_rank_with_three_workers(tmp_path: Path) -> None:
    """Saved on 2 ranks x 2 workers (a real gloo run), resumed on 1 rank x 3 workers: every sample once."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = tmp_path / "elastic.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, progress=False)
    mp.spawn(_save_rank_main, args=(str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=WORLD, join=True)
    saved = [json.loads((tmp_path / f"save{r}.json").read_text()) for r in range(WORLD)]
    position = torchrecord.loader_position(saved[0]["states"])
    assert position == torchrecord.loader_position(saved[1]["states"])
    ds = RecordDataset(path, batch_size=4, shuffle_buffer=8, seed=5, rank=0, world_size=1)
    ds.set_epoch(2)
    ds.load_state_dict(position)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=3, multiprocessing_context="fork")
    after = [int(x) for _, labels in loader for x in labels]
    before = saved[0]["seen"] + saved[1]["seen"]
    assert len(before) == 2 * 5 * 4 and len(set(before)) == len(before)
    assert not set(before) & set(after)
    assert_exactly_once(before + after, COUNT)
