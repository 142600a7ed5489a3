"""StreamDataset: the stream plan, continuity, workers in rotation, resume, gloo ranks."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from tests.helpers import assert_exactly_once
from torchrecord import StreamDataset, StreamLoader, write_record
from torchrecord._order.stream_plan import plan_streams
from torchrecord.errors import ResumeStateError

B = 4


def _sequences(lengths: list[int]) -> list[dict[str, Any]]:
    """Frames {"x": float32[3] holding (sequence, frame), "seq": int, "t": int}, sequence by sequence."""
    out = []
    for g, n in enumerate(lengths):
        for t in range(n):
            out.append({"x": np.array([g, t, g * 1000 + t], np.float32), "seq": g, "t": t})
    return out


LENGTHS = [int(x) for x in np.random.default_rng(0).integers(1, 40, size=30)]


@pytest.fixture(scope="module")
def stream_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("streams") / "seqs.tr"
    write_record(_sequences(LENGTHS), path, group_by="seq", seed=3, samples_per_record=1, progress=False)
    return str(path)


# -- the plan (pure) ---------------------------------------------------------------------


@pytest.mark.parametrize("streams", [1, 3, 8, 50])
@pytest.mark.parametrize("tail", ["pad", "drop"])
def test_plan_covers_every_frame_once_in_whole_sequences(streams: int, tail: str) -> None:
    lengths = np.random.default_rng(streams).integers(1, 30, size=40)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    plan = plan_streams(offsets, streams=streams, seed=1, epoch=0, tail=tail)
    cells = plan.cells(range(streams), 0, plan.steps_per_epoch)
    valid = cells.sample[cells.mask]
    if tail == "pad":
        assert_exactly_once(valid.tolist(), int(offsets[-1]))
        assert plan.dropped == 0
    else:
        assert cells.mask.all()
        assert len(valid) + plan.dropped == offsets[-1]
        assert len(set(valid.tolist())) == len(valid)
    for s in range(streams):
        row, seq, start = cells.sample[s], cells.sequence[s], cells.start[s]
        ok = row >= 0
        # starts exactly where a sequence begins; otherwise the next stored frame of the same sequence
        for t in range(1, int(ok.sum())):
            if start[t]:
                assert row[t] == offsets[seq[t]]
            else:
                assert seq[t] == seq[t - 1] and row[t] == row[t - 1] + 1
        if ok.any():
            assert start[0] and row[0] == offsets[seq[0]]
    # balanced: no stream longer than the shortest plus the longest sequence
    assert plan.lengths.max() - plan.lengths.min() <= lengths.max()


@pytest.mark.parametrize("tail", ["pad", "drop"])
def test_cells_of_many_batches_at_once_equal_each_batch_alone(tail: str) -> None:
    """One lookup for a worker's group of batches (steps t, t + n, ...; a short last batch; padding)."""
    lengths = np.random.default_rng(7).integers(1, 40, size=60)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    plan = plan_streams(offsets, streams=6, seed=2, epoch=1, tail=tail)
    total, steps = plan.steps_per_epoch, 7
    for streams in (range(0, 3), range(3, 6)):
        for workers in (1, 3):
            starts = [t * steps for t in range(1, -(-total // steps), workers)]
            together = plan.batch_cells(streams, starts, steps)
            assert together.sample.shape == (len(starts), 3, steps)
            for j, t0 in enumerate(starts):
                t1 = min(t0 + steps, total)
                alone = plan.cells(streams, t0, t1)
                width = t1 - t0
                for got, want, pad in (
                    (together.sample[j], alone.sample, -1),
                    (together.sequence[j], alone.sequence, -1),
                    (together.start[j], alone.start, False),
                ):
                    assert got.flags.c_contiguous
                    assert np.array_equal(got[:, :width], want)
                    assert (got[:, width:] == pad).all()  # past the epoch's last step: padding
    empty = plan.batch_cells(range(0, 3), [], steps)
    assert empty.sample.shape == (0, 3, steps)


def test_plan_changes_per_epoch_and_is_pure() -> None:
    offsets = np.concatenate(([0], np.cumsum(np.arange(1, 30))))
    a = plan_streams(offsets, streams=4, seed=0, epoch=0)
    again = plan_streams(offsets, streams=4, seed=0, epoch=0)
    assert [x.tolist() for x in a.order] == [x.tolist() for x in again.order]
    b = plan_streams(offsets, streams=4, seed=0, epoch=1)
    assert [x.tolist() for x in a.order] != [x.tolist() for x in b.order]


# -- the dataset -------------------------------------------------------------------------


def _check_batches(batches: list[dict[str, Any]], steps: int) -> None:
    """Continuity per position, start flags, every frame once over valid cells."""
    seen: list[int] = []
    last: dict[int, tuple[int, int]] = {}
    source_of: dict[int, int] = {}  # stored group index -> the source's sequence id (groups were pre-shuffled)
    for batch in batches:
        x, mask, start, seq = batch["data"]["x"], batch["mask"], batch["start"], batch["sequence"]
        assert x.shape[:2] == (B, steps) and mask.dtype == torch.bool
        for b in range(B):
            for t in range(steps):
                if not mask[b, t]:
                    assert seq[b, t] == -1 and (x[b, t] == 0).all()
                    continue
                g, frame = int(x[b, t, 0]), int(x[b, t, 1])
                assert source_of.setdefault(int(seq[b, t]), g) == g
                seen.append(int(x[b, t, 2]))
                assert bool(start[b, t]) == (frame == 0)
                if not start[b, t]:
                    assert last[b] == (g, frame - 1), "position b does not continue its sequence"
                last[b] = (g, frame)
    frames = [g * 1000 + t for g, n in enumerate(LENGTHS) for t in range(n)]
    assert Counter(seen) == Counter(frames)
    assert len(set(source_of.values())) == len(source_of) == len(LENGTHS)


@pytest.mark.parametrize("steps", [1, 16])
def test_batches_continue_streams(stream_set: str, steps: int) -> None:
    ds = StreamDataset(stream_set, batch_size=B, steps=steps, seed=2)
    batches = list(ds)
    assert len(batches) == len(ds)
    _check_batches(batches, steps)
    ds.set_epoch(1)
    assert [b["sequence"].tolist() for b in ds] != [b["sequence"].tolist() for b in batches]


@pytest.mark.parametrize(
    ("context", "steps"),
    # spawn with steps=16 stays in every run; spawn with steps=1 adds about 10 s and nothing new: slow
    [("fork", 1), ("fork", 16), pytest.param("spawn", 1, marks=pytest.mark.slow), ("spawn", 16)],
)
def test_any_number_of_workers_gives_identical_batches(stream_set: str, context: str, steps: int) -> None:
    ds = StreamDataset(stream_set, batch_size=B, steps=steps, seed=2)
    reference = list(ds)
    workers = [1, 2, 3, 5] if context == "fork" else [2]
    for n in workers:  # steps=16 gives fewer batches than 5 workers for short epochs too
        loader = DataLoader(ds, batch_size=None, num_workers=n, multiprocessing_context=context)
        got = list(loader)
        assert len(got) == len(reference)
        for a, b in zip(got, reference):
            for key in ("mask", "start", "sequence"):
                assert torch.equal(a[key], b[key]), (n, key)
            assert torch.equal(a["data"]["x"], b["data"]["x"])


def _packed_variants() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"samples_per_record": 5}]
    if importlib.util.find_spec("cramjam") is not None:
        out.append({"samples_per_record": 5, "compression": "zstd"})
    return out


@pytest.mark.parametrize("kw", _packed_variants(), ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_packed_records_give_the_same_batches(stream_set: str, tmp_path: Path, kw: dict[str, Any]) -> None:
    """Frames read as whole packed records (each record of a worker's group once), with and without a transform."""
    path = tmp_path / "packed.tr"
    write_record(_sequences(LENGTHS), path, group_by="seq", seed=3, progress=False, **kw)

    def double(s: dict[str, Any]) -> dict[str, Any]:
        return {"y": torch.from_numpy(s["x"] * 2)}

    for steps in (1, 3):
        for transform in (None, double):
            reference = list(StreamDataset(stream_set, batch_size=B, steps=steps, seed=2, transform=transform))
            packed = StreamDataset(path, batch_size=B, steps=steps, seed=2, transform=transform, check="checksums")
            got = list(DataLoader(packed, batch_size=None, num_workers=2)) if steps == 3 else list(packed)
            assert len(got) == len(reference)
            if transform is None:
                _check_batches(got, steps)
            for a, b in zip(got, reference):
                for key in ("mask", "start", "sequence"):
                    assert torch.equal(a[key], b[key])
                assert a["data"].keys() == b["data"].keys()
                for name in a["data"]:
                    assert torch.equal(a["data"][name], b["data"][name])
            if steps == 1:  # read in this process: every record at least once, never more than its frames
                assert -(-sum(LENGTHS) // 5) <= packed.records_read < sum(LENGTHS)


def test_every_frame_is_read_once_over_workers(stream_set: str) -> None:
    alone = StreamDataset(stream_set, batch_size=B, steps=3, seed=2)
    assert sum(int(b["mask"].sum()) for b in alone) == alone.records_read == sum(LENGTHS)
    ds = StreamDataset(stream_set, batch_size=B, steps=3, seed=2)
    valid = 0
    for worker in range(3):
        part = StreamDataset(stream_set, batch_size=B, steps=3, seed=2)
        for batch in part.batches(worker, 3):
            valid += int(batch["mask"].sum())
        assert part.records_read == sum(int(b["mask"].sum()) for b in ds.batches(worker, 3))
    assert valid == sum(LENGTHS)


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 7, 16])
def test_drop_last_yielded_plus_dropped_is_every_frame(stream_set: str, steps: int) -> None:
    """issue 27 item 2: the frames cut off to whole ``steps`` are counted in ``dropped`` too."""
    ds = StreamDataset(stream_set, batch_size=B, steps=steps, drop_last=True)
    batches = list(ds)
    kept = sum(int(b["mask"].sum()) for b in batches)
    assert len(batches) == len(ds)
    assert all(bool(b["mask"].all()) for b in batches)
    assert kept + ds.dropped == sum(LENGTHS)
    # two ranks: the frames of both ranks' batches plus dropped are every frame
    ranks = [StreamDataset(stream_set, batch_size=2, steps=steps, drop_last=True, rank=r, world_size=2) for r in (0, 1)]
    both = sum(int(b["mask"].sum()) for r in ranks for b in r)
    assert both + ranks[0].dropped == sum(LENGTHS) and ranks[0].dropped == ranks[1].dropped


@pytest.mark.parametrize("steps", [3, 5])
def test_drop_last_yielded_plus_dropped_with_workers(stream_set: str, steps: int) -> None:
    ds = StreamDataset(stream_set, batch_size=B, steps=steps, drop_last=True, seed=4)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == ds.check_loader(loader)
    assert sum(int(b["mask"].sum()) for b in batches) + ds.dropped == sum(LENGTHS)


def test_transform_runs_per_frame(stream_set: str) -> None:
    ds = StreamDataset(stream_set, batch_size=B, steps=4, transform=lambda s: {"y": torch.from_numpy(s["x"] * 2)})
    batch = next(iter(ds))
    plain = next(iter(StreamDataset(stream_set, batch_size=B, steps=4)))
    assert torch.equal(batch["data"]["y"], plain["data"]["x"] * 2)


def test_transformed_frames_of_any_structure_collate_by_name(stream_set: str) -> None:
    """Flat dicts collate by key (any key order); nested ones through their structure; ragged leaves as lists."""
    plain = list(StreamDataset(stream_set, batch_size=B, steps=4, seed=1))

    def reordered(s: dict[str, Any]) -> dict[str, Any]:  # key order differs from frame to frame
        pairs = [("y", s["x"] * 2), ("t", int(s["t"])), ("name", f"f{int(s['t'])}")]
        return dict(pairs[::-1] if int(s["t"]) % 2 else pairs)

    def nested(s: dict[str, Any]) -> Any:
        return (torch.from_numpy(s["x"]), {"t": np.int32(s["t"]), "ragged": np.zeros(int(s["t"]) % 3)})

    for transform in (reordered, nested):
        batches = list(StreamDataset(stream_set, batch_size=B, steps=4, seed=1, transform=transform))
        assert len(batches) == len(plain)
        for got, want in zip(batches, plain):
            mask, x = want["mask"], want["data"]["x"]
            t = x[..., 1].to(torch.int64)
            if transform is reordered:
                data = got["data"]
                assert torch.equal(data["y"], x * 2) and data["y"].dtype == torch.float32
                assert torch.equal(data["t"], torch.where(mask, t, 0)) and data["t"].dtype == torch.int64
                names = [[f"f{int(t[b, i])}" if mask[b, i] else None for i in range(4)] for b in range(B)]
                assert data["name"] == names  # strings: nested lists, None on padding
            else:
                frame, extra = got["data"]
                assert torch.equal(frame, x)
                assert extra["t"].dtype == torch.int32 and torch.equal(extra["t"], torch.where(mask, t, 0).int())
                ragged = extra["ragged"]  # shapes differ: nested lists of arrays, None on padding
                if isinstance(ragged, torch.Tensor):  # one shape in this batch: stacked after all
                    assert {int(t[b, i]) % 3 for b in range(B) for i in range(4) if mask[b, i]} == {ragged.shape[2]}
                    continue
                for b in range(B):
                    for i in range(4):
                        cell = ragged[b][i]
                        assert (cell is None) == (not mask[b, i])
                        if cell is not None:
                            assert cell.shape == (int(t[b, i]) % 3,)


def test_frames_of_different_structures_are_named(stream_set: str) -> None:
    def uneven(s: dict[str, Any]) -> Any:
        return {"x": s["x"]} if int(s["t"]) < 2 else {"x": s["x"], "extra": 1}

    named = r"seqs\.tr: sample \d+ \(sequence \d+\): the transform returned a frame whose structure differs"
    with pytest.raises(ValueError, match=named):
        list(StreamDataset(stream_set, batch_size=B, steps=4, seed=1, transform=uneven))


def test_resume_with_another_number_of_workers_continues_identically(stream_set: str) -> None:
    ds = StreamDataset(stream_set, batch_size=B, steps=2, seed=4)
    reference = [b["sequence"].tolist() for b in ds]
    resumed = StreamDataset(stream_set, batch_size=B, steps=2, seed=4)
    position = resumed.position_after(7, num_workers=2)  # two workers handed out 7 batches: 4 and 3
    assert [row[2] for row in position["readers"]] == [4, 3]
    resumed.load_state_dict(json.loads(json.dumps(position)))
    loader = DataLoader(resumed, batch_size=None, num_workers=3, multiprocessing_context="fork")
    assert [b["sequence"].tolist() for b in loader] == reference[7:]


def test_resume_with_other_streams_is_refused(stream_set: str) -> None:
    state = StreamDataset(stream_set, batch_size=B).state_dict()
    with pytest.raises(ValueError, match="hidden state could not follow"):
        StreamDataset(stream_set, batch_size=B + 1).load_state_dict(state)


def test_errors(stream_set: str, tmp_path: Path) -> None:
    flat = tmp_path / "flat.tr"
    write_record(list(range(10)), flat, progress=False)
    with pytest.raises(ValueError, match="group_by"):
        StreamDataset(flat, batch_size=2)
    with pytest.raises(ValueError, match="batch_size=None"):
        ds = StreamDataset(stream_set, batch_size=B)
        ds.check_loader(DataLoader(ds, batch_size=4))


def _rank_main(rank: int, init_file: str, path: str, out_dir: str) -> None:
    early = StreamDataset(
        path, batch_size=B, steps=5, seed=1
    )  # made before the process group: StreamLoader reads it later
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ds = StreamDataset(path, batch_size=B, steps=5, seed=1)
        batches = [b["data"]["x"][:, :, 2].tolist() for b in DataLoader(ds, batch_size=None, num_workers=1)]
        bundled = [b["data"]["x"][:, :, 2].tolist() for b in StreamLoader(early, num_workers=1, bundle=3)]
        masks = [b["mask"].tolist() for b in ds]
        with open(os.path.join(out_dir, f"r{rank}.json"), "w") as f:
            json.dump({"len": len(ds), "batches": batches, "bundled": bundled, "masks": masks}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_play_the_2b_stream_plan(stream_set: str, tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), stream_set, str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert reports[0]["len"] == reports[1]["len"] == len(reports[0]["batches"]) == len(reports[1]["batches"])
    both = StreamDataset(stream_set, batch_size=2 * B, steps=5, seed=1, rank=0, world_size=1)
    expected = [b["data"]["x"][:, :, 2].tolist() for b in both]
    for t, batch in enumerate(expected):
        assert reports[0]["batches"][t] == batch[:B] and reports[1]["batches"][t] == batch[B:]
    assert [r["bundled"] for r in reports] == [r["batches"] for r in reports]  # StreamLoader: the same, per rank


def test_resume_through_stateful_dataloader(stream_set: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    reference = [b["sequence"].tolist() for b in StreamDataset(stream_set, batch_size=B, steps=2, seed=4)]
    loader = StatefulDataLoader(
        StreamDataset(stream_set, batch_size=B, steps=2, seed=4), batch_size=None, num_workers=2
    )
    it = iter(loader)
    before = [next(it)["sequence"].tolist() for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    again = StatefulDataLoader(StreamDataset(stream_set, batch_size=B, steps=2, seed=4), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert before + [b["sequence"].tolist() for b in again] == reference


def test_a_batch_of_padding_only_keeps_its_shapes(stream_set: str) -> None:
    ds = StreamDataset(stream_set, batch_size=40, steps=3, seed=1)  # more streams than sequences: some only pad
    for batch in ds:
        assert batch["data"]["x"].shape == (40, 3, 3) and batch["data"]["seq"].shape == (40, 3)


def _cells_one_stream_at_a_time(plan: Any, streams: range, t0: int, t1: int) -> tuple[np.ndarray, ...]:
    """The plan's definition of a cell, stream by stream: frame t of the concatenation of its sequences."""
    sample = np.full((len(streams), t1 - t0), -1, np.int64)
    sequence = sample.copy()
    start = np.zeros(sample.shape, bool)
    for row, s in enumerate(streams):
        frames = [(int(g), i) for g in plan.order[s] for i in range(int(plan.offsets[g + 1] - plan.offsets[g]))]
        for col, t in enumerate(range(t0, t1)):
            if t < len(frames):
                g, i = frames[t]
                sample[row, col], sequence[row, col], start[row, col] = plan.offsets[g] + i, g, i == 0
    return sample, sequence, start


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_cells_match_the_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, size=int(rng.integers(0, 25)))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    streams = int(rng.integers(1, 9))
    plan = plan_streams(offsets, streams=streams, seed=seed, epoch=1, tail="pad" if seed % 2 else "drop")
    lo = int(rng.integers(0, streams))
    for part in (range(streams), range(lo, streams), range(lo, lo)):
        for t0 in range(0, plan.steps_per_epoch + 4, 3):
            got = plan.cells(part, t0, t0 + 5)
            want = _cells_one_stream_at_a_time(plan, part, t0, t0 + 5)
            for a, b in zip((got.sample, got.sequence, got.start), want):
                assert np.array_equal(a, b), (part, t0)


def test_a_batch_of_padding_only_keeps_the_transformed_structure(tmp_path: Path) -> None:
    # shuffle=False deals sequences 0..3 to streams 0..3: rank 1 (streams 2, 3) ends after 2 steps, rank 0 after 20
    path = tmp_path / "uneven.tr"
    write_record(_sequences([20, 20, 2, 2]), path, group_by="seq", shuffle=False, progress=False)
    for transform in (None, lambda s: {"y": torch.from_numpy(s["x"] * 2), "label": s["seq"]}):
        ds = StreamDataset(path, batch_size=2, steps=1, shuffle=False, rank=1, world_size=2, transform=transform)
        batches = list(ds)
        assert len(batches) == 20 and int(sum(b["mask"].sum() for b in batches)) == 4
        first, last = batches[0]["data"], batches[-1]["data"]
        assert not batches[-1]["mask"].any()
        key = "x" if transform is None else "y"
        assert last[key].shape == first[key].shape == (2, 1, 3)
        assert not last[key].any()
        if transform is not None:
            assert last["label"].shape == (2, 1) and first["label"].tolist() == [[2], [3]]


@pytest.mark.parametrize("steps", [1, 3])
def test_drop_last_is_the_old_tail_drop(stream_set: str, steps: int) -> None:
    """drop_last=True (was tail="drop") plays the plan of tail="drop", cut to whole steps; False the padded one."""
    for drop_last, tail in ((True, "drop"), (False, "pad")):
        ds = StreamDataset(stream_set, batch_size=B, steps=steps, seed=5, drop_last=drop_last)
        plan = plan_streams(ds.file.groups, streams=B, seed=5, epoch=0, tail=tail)
        total = plan.steps_per_epoch
        assert len(ds) == (total // steps if drop_last else -(-total // steps))
        batches = list(ds)
        assert len(batches) == len(ds)
        cells = plan.batch_cells(range(B), [t * steps for t in range(len(batches))], steps)
        for j, batch in enumerate(batches):
            assert batch["sequence"].tolist() == cells.sequence[j].tolist()
        if drop_last:
            assert all(bool(b["mask"].all()) for b in batches)


def test_batch_transform_on_stream_batches(stream_set: str) -> None:
    plain = list(StreamDataset(stream_set, batch_size=B, steps=2, seed=1))
    ds = StreamDataset(stream_set, batch_size=B, steps=2, seed=1, batch_transform=lambda b: {**b, "n": b["mask"].sum()})
    for a, b in zip(plain, DataLoader(ds, batch_size=None, num_workers=2)):
        assert int(b["n"]) == int(a["mask"].sum()) and torch.equal(a["sequence"], b["sequence"])


def test_streams_refuse_positional_batch_size_and_old_tail_states(stream_set: str) -> None:
    with pytest.raises(TypeError):
        StreamDataset(stream_set, B)  # type: ignore[misc]
    with pytest.raises(TypeError):
        StreamDataset(stream_set, batch_size=B, tail="drop")  # type: ignore[call-arg]
    ds = StreamDataset(stream_set, batch_size=B, drop_last=True)
    old = {k: v for k, v in ds.state_dict().items() if k != "plan"}
    old.update(tail="drop", version=1)
    with pytest.raises(ValueError, match=r"version 1, saved by an older torchrecord"):
        ds.load_state_dict(old)


# -- crafted states (issue 30: resume states are untrusted input) ---------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("yielded", -1, "must be >= 0"),
        ("yielded", 10**12, "has"),  # yielded none (an IndexError in another run)
        ("yielded", 2.0, "not float"),
        ("yielded", True, "not a bool"),
        ("worker", 5, "the last worker of its num_workers"),
        ("num_workers", 0, "must be >= 1"),
        ("plan.steps", True, "steps=True, this dataset has 4"),
        ("epoch", 0.5, "must be an integer"),
    ],
)
def test_a_crafted_stream_state_is_refused_naming_the_path_and_field(
    stream_set: str, field: str, value: Any, reason: str
) -> None:
    ds = StreamDataset(stream_set, batch_size=3, steps=4)
    it = iter(ds)
    next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    whole = len(ds)
    fresh = StreamDataset(stream_set, batch_size=3, steps=4)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == whole - 1
    crafted = json.loads(json.dumps(state))
    key = field.split(".")[-1]
    (crafted["plan"] if field.startswith("plan.") else crafted)[key] = value
    with pytest.raises(ResumeStateError) as info:
        fresh.load_state_dict(crafted)
    message = str(info.value)
    assert stream_set in message and f"{key}=" in message and reason in message, message
