"""RecordLoader: a DataLoader whose state is every rank's position, merged; real gloo ranks and workers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, RecordLoader
from torchrecord.errors import ArgumentError, ArgumentTypeError, ResumeStateError

COUNT, WORLD, BATCH, WORKERS = 101, 2, 4, 2
STOP = 5  # batches each rank takes before the checkpoint (of 13 per rank and epoch)
SETTINGS: dict[str, Any] = {"batch_size": BATCH, "shuffle_buffer": 8, "seed": 5}


def _labels(batches: Any) -> list[list[int]]:
    return [[int(x) for x in labels] for _, labels in batches]


def _rank_main(rank: int, init_file: str, path: str, out_dir: str) -> None:
    """One of two gloo ranks: STOP batches, a state_dict, then a fresh loader resumed from rank 0's state."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = RecordDataset(path, **SETTINGS)  # rank and world from torch.distributed
        ds.set_epoch(1)
        loader = RecordLoader(ds, num_workers=WORKERS, multiprocessing_context="fork")
        it = iter(loader)
        seen = [[int(x) for x in next(it)[1]] for _ in range(STOP)]
        state = loader.state_dict()  # a collective: both ranks call it
        rest = _labels(it)
        end_state = loader.state_dict()  # after the whole epoch
        gathered: list[Any] = [None] * WORLD
        dist.all_gather_object(gathered, state)
        # what Lightning does: rank 0's state only, loaded on every rank
        fresh = RecordDataset(path, **SETTINGS)
        resumed_loader = RecordLoader(fresh, num_workers=WORKERS, multiprocessing_context="fork")
        resumed_loader.load_state_dict(gathered[0])
        before_iterating = resumed_loader.state_dict()  # the loaded count holds before the first batch
        it = iter(resumed_loader)
        one_more = [int(x) for x in next(it)[1]]
        after_one = resumed_loader.state_dict()
        resumed = [one_more, *_labels(it)]
        report = {
            "seen": seen,
            "rest": rest,
            "state": state,
            "gathered": gathered,
            "end": end_state,
            "before_iterating": before_iterating,
            "after_one": after_one,
            "resumed": resumed,
            "epoch": fresh.epoch,
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_gloo_ranks_resume_from_rank_zeros_state_alone(tmp_path: Path) -> None:
    path = tmp_path / "run.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, progress=False)
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=WORLD, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    # the state is the same on every rank: the merged position of both ranks and their workers
    assert reports[0]["gathered"][0] == reports[0]["gathered"][1] == reports[1]["state"] == reports[0]["state"]
    state = reports[0]["state"]
    assert state["batches"] == STOP
    position = state["position"]
    assert position["epoch"] == 1
    assert sorted((r, w) for r, w, _ in position["readers"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(n for _, _, n in position["readers"]) == WORLD * STOP
    for rank, report in enumerate(reports):
        plain = RecordDataset(path, **SETTINGS, rank=rank, world_size=WORLD)
        plain.set_epoch(1)
        expected = _labels(DataLoader(plain, batch_size=None, num_workers=WORKERS))
        assert report["seen"] + report["rest"] == expected, f"rank {rank}: the loader reads what a DataLoader reads"
        # rank 0's state alone resumes this rank: exactly the rest of its epoch, in order
        assert report["epoch"] == 1
        assert report["resumed"] == expected[STOP:], f"rank {rank}"
        assert report["before_iterating"] == state
        assert report["after_one"]["batches"] == STOP + 1
        assert report["end"]["batches"] == len(expected)
    # the same position as the states of both ranks give, merged by hand; the epoch's end holds every sample
    assert reports[0]["after_one"] == reports[1]["after_one"]
    assert sum(n for _, _, n in reports[0]["end"]["position"]["readers"]) == WORLD * len(expected)
    seen = [x for r in reports for batch in r["seen"] + r["rest"] for x in batch]
    assert_exactly_once(seen, COUNT, pad=len(seen) - COUNT)

    # elastic: the 2-rank state on 1 rank with 3 workers: every sample not yet handed out, once
    ds = RecordDataset(path, **SETTINGS, rank=0, world_size=1)
    loader = RecordLoader(ds, num_workers=3)
    loader.load_state_dict(state)
    assert loader.state_dict() == state  # nothing handed out since: the loaded state, as it was
    it = iter(loader)
    first = [int(x) for x in next(it)[1]]
    middle = loader.state_dict()  # mid-epoch after an elastic resume: a position resting on the loaded one
    assert middle["batches"] == 1 and middle["position"]["base"] == state["position"]
    after = first + [x for batch in _labels(it) for x in batch]
    before = [x for r in reports for batch in r["seen"] for x in batch]
    assert not set(before) & set(after)
    assert_exactly_once(before + after, COUNT, pad=len(before + after) - COUNT)
    end = loader.state_dict()
    assert end["batches"] == len(loader) and end["position"]["world_size"] == 1
    # and that middle state resumed once more, on 2 workers: the rest after the first batch, once
    again = RecordLoader(RecordDataset(path, **SETTINGS, rank=0, world_size=1), num_workers=2)
    again.load_state_dict(json.loads(json.dumps(middle)))
    rest = [x for batch in _labels(again) for x in batch]
    assert sorted(before + first + rest) == sorted(before + after)


def test_one_process_resumes_the_rest_of_the_epoch_in_batch_and_per_sample_mode(tmp_path: Path) -> None:
    path = tmp_path / "one.tr"
    torchrecord.write_record(IndexedImages(60), path, progress=False)
    for dataset_kwargs, loader_kwargs in (({"batch_size": 4}, {}), ({}, {"batch_size": 5})):
        ds = RecordDataset(path, shuffle_buffer=8, **dataset_kwargs)
        ds.set_epoch(3)
        loader = RecordLoader(ds, num_workers=2, **loader_kwargs)
        full = _labels(loader)
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        state = loader.state_dict()
        del it, head
        json.dumps(state)  # plain values: any checkpoint format holds it
        fresh = RecordDataset(path, shuffle_buffer=8, **dataset_kwargs)  # epoch 0: load sets the saved one
        resumed = RecordLoader(fresh, num_workers=2, **loader_kwargs)
        resumed.load_state_dict(state)
        assert fresh.epoch == 3
        assert _labels(resumed) == full[4:], dataset_kwargs or loader_kwargs
        # the next epoch starts afresh: a whole epoch, and a state of no batches until it iterates
        fresh.set_epoch(4)
        assert resumed.state_dict()["batches"] == 0
        assert sum(len(b) for b in _labels(resumed)) == 60


def test_bad_arguments_and_states_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.tr"
    torchrecord.write_record(IndexedImages(20), path, progress=False)
    ds = RecordDataset(path, batch_size=4)
    with pytest.raises(ArgumentTypeError, match="RecordLoader reads torchrecord's reader datasets"):
        RecordLoader(torchrecord.RecordFile(path))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="shuffle"):
        RecordLoader(ds, shuffle=True)
    with pytest.raises(ArgumentError, match="leave batch_size out"):
        RecordLoader(ds, batch_size=4)
    with pytest.raises(ArgumentError, match="num_workers"):
        RecordLoader(ds, num_workers=-1)
    loader = RecordLoader(ds)
    with pytest.raises(ResumeStateError, match="not a RecordLoader state"):
        loader.load_state_dict(ds.state_dict())
    good = loader.state_dict()
    with pytest.raises(ResumeStateError, match="'batches' must be an integer"):
        loader.load_state_dict({**good, "batches": -1})
    other = RecordDataset(path, batch_size=5)  # other order settings: the dataset refuses the position
    with pytest.raises(ResumeStateError, match="batch_size"):
        RecordLoader(other).load_state_dict(good)


def _tagged(batch: Any) -> tuple[str, Any]:
    """A loader-level collate_fn (module level: spawn workers pickle it)."""
    return ("collated", batch)


def _as_numpy(batch: Any) -> tuple[Any, Any]:
    """A batch_transform that hands NumPy arrays back (module level: spawn workers pickle it)."""
    images, labels = batch
    return images.numpy(), labels.numpy()


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_mode_yields_the_same_structure_at_any_number_of_workers(tmp_path: Path, workers: int) -> None:
    """Tuples stay tuples (default_convert would make them lists, but bundles from workers never met it), a
    batch_transform's NumPy arrays become tensors, and a loader collate_fn gets each batch, not a bundle."""
    path = tmp_path / "structure.tr"
    torchrecord.write_record(IndexedImages(40), path, progress=False)
    context = {"multiprocessing_context": "fork"} if workers else {}
    plain = list(RecordLoader(RecordDataset(path, batch_size=4, seed=1), num_workers=workers, **context))
    assert len(plain) == 10
    assert all(type(b) is tuple and all(type(leaf) is torch.Tensor for leaf in b) for b in plain)
    assert sorted(int(x) for _, labels in plain for x in labels) == list(range(40))

    numpy_ds = RecordDataset(path, batch_size=4, seed=1, batch_transform=_as_numpy)
    converted = list(RecordLoader(numpy_ds, num_workers=workers, **context))
    assert all(type(b) is tuple and all(type(leaf) is torch.Tensor for leaf in b) for b in converted)
    assert [b[1].tolist() for b in converted] == [b[1].tolist() for b in plain]

    tagged = list(
        RecordLoader(RecordDataset(path, batch_size=4, seed=1), num_workers=workers, collate_fn=_tagged, **context)
    )
    assert [tag for tag, _ in tagged] == ["collated"] * 10
    assert [batch[1].tolist() for _, batch in tagged] == [b[1].tolist() for b in plain]


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_mode_keeps_the_profiler_span_when_profiling(tmp_path: Path, workers: int) -> None:
    """The loader skips torch's per-item profiler span (a batch, or with workers a bundle), except while a
    profiler records."""
    path = tmp_path / "profiled.tr"
    torchrecord.write_record(IndexedImages(12), path, progress=False)
    loader = RecordLoader(RecordDataset(path, batch_size=4), num_workers=workers)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        batches = list(loader)
    assert len(batches) == 3
    spans = [e for e in prof.events() if e.name.startswith("enumerate(DataLoader)")]
    assert len(spans) >= (3 if workers == 0 else 2)  # with workers: a bundle from each
    assert [batch[1].tolist() for batch in batches] == [batch[1].tolist() for batch in loader]
