"""WindowDataset: SequenceDataset's windows exactly once per epoch over ranks and workers, read once per buffer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers import assert_exactly_once
from tests.robomimic_files import write_demo_file
from torchrecord import SequenceDataset, WindowDataset
from torchrecord._order.window_plan import Windows, WindowSpec
from torchrecord.convert import from_robomimic

OBS_KEYS = ["pos", "cam", "eef"]
DATASET_KEYS = ["actions", "rewards", "dones"]
LENGTHS = [9, 5, 40, 17, 6, 23, 12, 31, 8, 14]


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("windows")
    write_demo_file(root / "demo.hdf5", LENGTHS, seed=2)
    from_robomimic(root / "demo.hdf5", root / "demo.tr", progress=False)
    return str(root / "demo.tr")


@pytest.fixture(scope="module")
def unpacked_set(demo_set: str) -> str:
    """The same demos with one step per record, so that records read count frames."""
    root = Path(demo_set).parent
    from_robomimic(root / "demo.hdf5", root / "unpacked.tr", progress=False, samples_per_record=1)
    return str(root / "unpacked.tr")


def window_ids(batch: dict[str, Any], frame_stack: int) -> list[tuple[int, int]]:
    """(demo, centre frame) of each window of a batch: "pos" holds (demo, step) and the centre is never padding."""
    pos = batch["obs"]["pos"]
    if pos.dim() == 2:  # a single window
        pos = pos[None]
    centre = pos[:, frame_stack - 1, :2].to(torch.int64)
    return [(int(a), int(b)) for a, b in centre.tolist()]


_REFERENCES: dict[str, tuple[SequenceDataset, dict[tuple[int, int], int]]] = {}


def reference(path: str, **kw: Any) -> tuple[SequenceDataset, dict[tuple[int, int], int]]:
    """SequenceDataset with these parameters, and the index of each window by its (demo, centre frame)."""
    key = repr((path, sorted(kw.items())))
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(path, **kw)
    return _REFERENCES[key]


def _reference(path: str, **kw: Any) -> tuple[SequenceDataset, dict[tuple[int, int], int]]:
    seq = SequenceDataset(path, OBS_KEYS, DATASET_KEYS, **kw)
    index = {}
    for i in range(len(seq)):
        pos = seq[i]["obs"]["pos"][seq.core.spec.frame_stack - 1]
        index[(int(pos[0]), int(pos[1]))] = i
    assert len(index) == len(seq)
    return seq, index


def check_batch_equals(batch: dict[str, Any], seq: SequenceDataset, rows: list[int], where: str = "") -> None:
    """Each row of a batch equals SequenceDataset's item (values and dtypes)."""
    for key, value in batch.items():
        if isinstance(value, dict):
            check_batch_equals(value, seq, rows, f"{where}{key}/")
            continue
        expected = np.stack([_get(seq[i], f"{where}{key}") for i in rows])
        assert value.dtype == torch.from_numpy(expected).dtype, f"{where}{key}"
        assert np.array_equal(value.numpy(), expected), f"{where}{key}"


def _get(item: dict[str, Any], path: str) -> np.ndarray:
    node: Any = item
    for part in path.split("/"):
        node = node[part]
    return np.asarray(node)


PARAMS = [
    {"frame_stack": 2, "seq_length": 4, "get_pad_mask": True, "goal_mode": "last"},
    {"frame_stack": 1, "seq_length": 5, "pad_seq_length": False, "frame_cache": None},
    {"frame_stack": 3, "seq_length": 1, "pad_frame_stack": False, "frame_cache": "all", "filter_by_attribute": "train"},
]


#: every world size x workers for the first parameters; the others on two corners (all of them: --runslow)
MATRIX = [(0, w, n) for w in (1, 2, 3) for n in (0, 2, 3)] + [(p, 3, 0) for p in (1, 2)] + [(p, 2, 2) for p in (1, 2)]
SLOW = [(p, w, n) for p in (1, 2) for w in (1, 2, 3) for n in (0, 2, 3) if (p, w, n) not in MATRIX]


@pytest.mark.parametrize(
    ("which", "world_size", "num_workers"), MATRIX + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW]
)
def test_every_window_once_per_epoch_over_ranks_and_workers(
    demo_set: str, which: int, world_size: int, num_workers: int
) -> None:
    params = PARAMS[which]
    seq, index = reference(demo_set, **params)
    n = len(seq)
    fs = params["frame_stack"]
    seen: list[int] = []
    per_rank = []
    for rank in range(world_size):
        ds = WindowDataset(
            demo_set,
            OBS_KEYS,
            DATASET_KEYS,
            **params,
            batch_size=8,
            rank=rank,
            world_size=world_size,
            seed=5,
            shuffle_buffer=40,
        )
        ds.set_epoch(1)
        batches = list(DataLoader(ds, batch_size=None, num_workers=num_workers))
        assert len(batches) == len(ds)
        rows = [index[w] for b in batches for w in window_ids(b, fs)]
        per_rank.append(len(rows))
        seen += rows
        if rank == 0:
            for b in batches[:3]:
                check_batch_equals(b, seq, [index[w] for w in window_ids(b, fs)])
    assert len(set(per_rank)) == 1  # every rank yields as many windows (DDP never waits)
    assert_exactly_once(seen, n, pad=-n % world_size)


def test_drop_last_and_single_windows(demo_set: str) -> None:
    seq, index = reference(demo_set, seq_length=3)
    n = len(seq)
    seen = []
    for rank in range(3):
        ds = WindowDataset(
            demo_set, OBS_KEYS, DATASET_KEYS, seq_length=3, batch_size=16, drop_last=True, rank=rank, world_size=3
        )
        batches = list(ds)
        assert len(batches) == len(ds) == (n // 3) // 16
        assert all(b["actions"].shape == (16, 3, 4) for b in batches)
        seen += [index[w] for b in batches for w in window_ids(b, 1)]
    assert len(set(seen)) == len(seen) == 3 * ((n // 3) // 16) * 16
    singles = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=3, shuffle=False)
    items = list(DataLoader(singles, batch_size=None, num_workers=0))
    assert len(items) == len(singles) == n
    assert sorted(index[window_ids(it, 1)[0]] for it in items) == list(range(n))
    assert items[0]["obs"]["cam"].shape == (3, 6, 5, 3) and items[0]["actions"].dtype == torch.float32
    collated = DataLoader(singles, batch_size=5, num_workers=0)
    first = next(iter(collated))
    check_batch_equals(first, seq, [index[w] for w in window_ids(first, 1)])


def test_order_changes_per_epoch_and_repeats_for_a_seed(demo_set: str) -> None:
    def order(epoch: int, seed: int = 0, shuffle: bool = True) -> list[tuple[int, int]]:
        ds = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, batch_size=32, seed=seed, shuffle=shuffle)
        ds.set_epoch(epoch)
        return [w for b in ds for w in window_ids(b, 1)]

    assert order(0) == order(0) and order(0) != order(1) and order(0, seed=1) != order(0)
    stored = order(0, shuffle=False)
    assert stored == sorted(stored, key=lambda w: (w[0], w[1]))  # demos in order, frames in order
    # the order is far from stored order: windows' rank correlation with their stored position is low
    positions = {w: i for i, w in enumerate(stored)}
    shuffled = [positions[w] for w in order(0)]
    assert abs(np.corrcoef(shuffled, np.arange(len(shuffled)))[0, 1]) < 0.3


def test_each_frame_read_once_per_buffer(unpacked_set: str) -> None:
    """cache=None, seq_length 10: about one read per frame, not one per window it appears in."""
    demo_set = unpacked_set
    frames = sum(LENGTHS) + len(LENGTHS)  # steps and each demo's final frames
    whole = WindowDataset(
        demo_set, OBS_KEYS, DATASET_KEYS, seq_length=10, frame_cache=None, batch_size=16, shuffle_buffer=10_000
    )
    assert whole.records_read == 0
    windows = sum(b["actions"].shape[0] for b in whole)
    assert windows == sum(LENGTHS)
    assert whole.records_read == frames  # one buffer: every record exactly once
    small = WindowDataset(
        demo_set, OBS_KEYS, DATASET_KEYS, seq_length=10, frame_cache=None, batch_size=16, shuffle_buffer=64
    )
    list(small)
    assert frames < small.records_read < 2 * frames < windows * 10 // 4


def test_cache_all_reads_nothing_while_iterating(demo_set: str, unpacked_set: str) -> None:
    ds = WindowDataset(unpacked_set, OBS_KEYS, DATASET_KEYS, seq_length=5, frame_cache="all", batch_size=16)
    filled = ds.records_read
    assert filled == sum(LENGTHS) + len(LENGTHS)  # each step and each final frame once
    list(ds)
    assert ds.records_read == filled
    packed = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=5, frame_cache="all", batch_size=16)
    filled = packed.records_read
    assert filled < sum(LENGTHS)  # several steps per record
    list(packed)
    assert packed.records_read == filled
    low = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=5, frame_cache="low_dim", batch_size=16)
    assert low.core.file_fields == ["obs.cam"]


def test_batches_and_dtypes_per_cache_mode(demo_set: str) -> None:
    for cache, action_dtype in ((None, torch.float64), ("low_dim", torch.float32), ("all", torch.float32)):
        ds = WindowDataset(
            demo_set,
            OBS_KEYS,
            DATASET_KEYS,
            frame_stack=2,
            seq_length=4,
            get_pad_mask=True,
            frame_cache=cache,
            batch_size=8,
            batch_transform=lambda b: {**b, "seen": True},
        )
        batch = next(iter(ds))
        assert batch["seen"] is True
        assert batch["actions"].dtype == action_dtype and batch["actions"].shape == (8, 5, 4)
        assert batch["dones"].dtype == (torch.int64 if cache is None else torch.float32)
        assert batch["obs"]["cam"].shape == (8, 5, 6, 5, 3) and batch["obs"]["cam"].dtype == torch.uint8
        assert batch["pad_mask"].shape == (8, 5, 1) and batch["pad_mask"].dtype == torch.bool
        assert list(batch) == ["actions", "rewards", "dones", "pad_mask", "obs", "next_obs", "seen"]


def test_refused_parameters(demo_set: str) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, batch_size=0)
    with pytest.raises(ValueError, match="rank"):
        WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, rank=3, world_size=3)
    with pytest.raises(ValueError, match=r"demo 'demo_1' has 5 frames"):
        WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=8, pad_seq_length=False)


def test_window_plan_is_robomimics_numbering() -> None:
    """The pure plan: counts, centres, padding repeats the first and last frames."""
    spec = WindowSpec(frame_stack=3, seq_length=2, pad_frame_stack=True, pad_seq_length=False)
    w = Windows(spec, np.array([4, 2]), ["a", "b"])
    assert len(w) == 3 + 1 and w.counts.tolist() == [3, 1]
    demo, t, mask = w.frames(np.arange(4))
    assert demo.tolist() == [0, 0, 0, 1]
    assert t.tolist() == [[0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3], [0, 0, 0, 1]]
    assert mask.tolist()[0] == [False, False, True, True]
    assert w.goal_frame(np.array([0, 1])).tolist() == [2, 0]
    with pytest.raises(ValueError, match="'b' has 2 frames"):
        Windows(WindowSpec(frame_stack=3, pad_frame_stack=False), np.array([4, 2]), ["a", "b"], "x.tr")


def test_pickles_as_configuration(demo_set: str, tmp_path: Path) -> None:
    import pickle

    ds = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=2, batch_size=4, shuffle=False)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.core.store.cache_bytes == 0
    a, b = next(iter(ds)), next(iter(copy))
    assert torch.equal(a["obs"]["cam"], b["obs"]["cam"]) and torch.equal(a["actions"], b["actions"])


def _fingerprints(batches: Any) -> list[list[tuple[int, int]]]:
    return [window_ids(b, 1) for b in batches]


def test_resume_in_process_continues_exactly(demo_set: str) -> None:
    def make() -> WindowDataset:
        ds = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=3, batch_size=8, shuffle_buffer=30, seed=3)
        ds.set_epoch(2)
        return ds

    reference = _fingerprints(make())
    first = make()
    it = iter(first)
    head = [window_ids(next(it), 1) for _ in range(7)]
    state = first.state_dict()
    assert state["yielded"] == 7 and state["epoch"] == 2
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert head + _fingerprints(resumed) == reference
    assert _fingerprints(resumed) == reference  # the resume point is used once
    other = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=4, batch_size=8, shuffle_buffer=30, seed=3)
    other.set_epoch(2)
    with pytest.raises(ValueError, match="windows"):
        other.load_state_dict(state)
    later = make()
    later.set_epoch(1)
    with pytest.raises(ValueError, match="set_epoch"):
        later.load_state_dict(state)


def test_resume_with_stateful_dataloader_workers(demo_set: str) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> WindowDataset:
        return WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=2, batch_size=8, shuffle_buffer=30)

    reference = _fingerprints(stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2))
    loader = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    it = iter(loader)
    head = [window_ids(next(it), 1) for _ in range(5)]
    saved = loader.state_dict()
    del it
    resumed = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    resumed.load_state_dict(saved)
    assert head + _fingerprints(resumed) == reference


def test_transform_is_per_window_and_batch_transform_per_batch(demo_set: str) -> None:
    kw: dict[str, Any] = dict(frame_stack=2, seq_length=4, batch_size=8, seed=2)
    plain = list(WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, **kw))
    seen: list[tuple[int, ...]] = []

    def per_window(window: dict[str, Any]) -> dict[str, Any]:
        seen.append(tuple(window["actions"].shape))
        return {"actions": window["actions"] * 2, "steps": window["actions"].shape[0]}

    windows = list(WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, transform=per_window, **kw))
    assert seen and all(shape == (5, 4) for shape in seen)  # one window [T, ...] at a time
    assert len(windows) == len(plain)
    for a, b in zip(plain, windows):
        assert torch.equal(b["actions"], a["actions"] * 2)  # collated back into [B, T, ...]
        assert b["steps"].tolist() == [5] * len(a["actions"])
    batched = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, batch_transform=lambda b: b["actions"].shape, **kw)
    assert [shape for shape in batched] == [a["actions"].shape for a in plain]
    collated = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, collate_fn=len, **kw)
    assert list(collated) == [len(a["actions"]) for a in plain]
    single = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, frame_stack=2, seq_length=4, transform=per_window)
    first = next(iter(single))
    assert first["actions"].shape == (5, 4) and first["steps"] == 5


def test_window_len_loader_is_exact_per_sample_with_workers(demo_set: str) -> None:
    ds = WindowDataset(demo_set, OBS_KEYS, DATASET_KEYS, seq_length=3, loader_batch_size=5)
    loader = DataLoader(ds, batch_size=5, num_workers=2)
    assert ds.check_loader(loader) == len(loader) == sum(1 for _ in loader)
