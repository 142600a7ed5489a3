"""The reader contract (tests/conformance.py), run the same way on every reader class.

RecordDataset, MixedDataset, StreamDataset, WindowDataset and LeRobotStreamDataset (DataLoader readers,
ranks and workers), and BatchIter and GroupBatchIter over ``torchrecord.load``
(in-process iterators: the checks without workers or ranks). A check a reader
does not meet today is a strict xfail naming the gap: when the gap closes, the
test fails until its mark is removed.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
import torch

from tests import conformance
from tests.conformance import BATCH, Case, Epoch
from tests.lerobot.handmade import write_dataset as write_lerobot
from tests.robomimic_files import write_demo_file
from torchrecord import (
    BatchIter,
    GroupBatchIter,
    LeRobotStreamDataset,
    MixedDataset,
    RecordDataset,
    RecordFile,
    SequenceDataset,
    StreamDataset,
    WindowDataset,
    load,
    write_record,
)
from torchrecord.convert import from_lerobot, from_robomimic

#: Samples of the plain set: odd, so that two ranks pad by one.
COUNT = 301
#: The sources of the mix: labels 0..119 and 120..200 (201 in all, odd).
MIX_SIZES = (120, 81)
#: Frames per sequence of the grouped set (the stream and group cases).
LENGTHS = [int(x) for x in np.random.default_rng(4).integers(2, 16, size=24)]
#: Demos of the robomimic file.
DEMOS = [9, 5, 14, 7, 6, 11, 12, 8]
OBS_KEYS = ["pos", "eef"]
DATASET_KEYS = ["actions"]


def _samples(first: int, n: int) -> list[dict[str, Any]]:
    return [{"x": np.full(2, i, np.float32), "label": i} for i in range(first, first + n)]


def _frames() -> list[dict[str, Any]]:
    out = []
    for g, n in enumerate(LENGTHS):
        for t in range(n):
            out.append({"x": np.array([g, t], np.float32), "label": len(out), "seq": g})
    return out


# -- factories (module level: the spawned process of the state check unpickles them) ----------------------


def make_record(path: str, **kw: Any) -> RecordDataset:
    return RecordDataset(path, **{"shuffle_buffer": 64, "block_size": 16, "seed": 3, **kw})


def make_mixed(paths: list[str], **kw: Any) -> MixedDataset:
    return MixedDataset(paths, **{"draw_size": 4, "shuffle_buffer": 32, "seed": 3, **kw})


def make_stream(path: str, **kw: Any) -> StreamDataset:
    return StreamDataset(path, **{"steps": 2, "seed": 3, **kw})


def make_window(path: str, **kw: Any) -> WindowDataset:
    return WindowDataset(
        path, OBS_KEYS, DATASET_KEYS, **{"seq_length": 3, "shuffle_buffer": 24, "block_size": 8, "seed": 3, **kw}
    )


def make_lerobot(path: str, **kw: Any) -> LeRobotStreamDataset:
    deltas = {"observation.images.top": [-0.1, 0.0], "next.reward": [0.0, 0.1]}
    return LeRobotStreamDataset(path, **{"delta_timestamps": deltas, "shuffle_buffer": 16, "seed": 3, **kw})


def make_batch_iter(path: str, *, batch_size: int, **kw: Any) -> BatchIter:
    return BatchIter(load(path), batch_size=batch_size, **{"seed": 3, **kw})


def make_group_batch_iter(path: str, *, batch_size: int, **kw: Any) -> GroupBatchIter:
    return GroupBatchIter(load(path), RecordFile(path).groups, groups_per_batch=batch_size, **{"seed": 3, **kw})


# -- identities ------------------------------------------------------------------------------------------------


def labels(item: Any) -> list[Hashable]:
    """The "label" of a sample, or of each sample of a batch (a dict, or GroupBatchIter's (batch, offsets))."""
    if isinstance(item, tuple):
        item = item[0]
    return [int(x) for x in torch.as_tensor(item["label"]).reshape(-1).tolist()]


def frame_indices(item: dict[str, Any]) -> list[Hashable]:
    """The global frame index of a LeRobot item, or of each item of a batch."""
    return [int(x) for x in torch.as_tensor(item["index"]).reshape(-1).tolist()]


def stream_labels(batch: dict[str, Any]) -> list[Hashable]:
    """The frames of a stream batch (valid cells, row-major)."""
    return [int(x) for x in batch["data"]["label"][batch["mask"]].tolist()]


def window_ids(item: dict[str, Any]) -> list[Hashable]:
    """(demo, first frame) of a window, or of each window of a batch: "pos" holds (demo, step)."""
    pos = item["obs"]["pos"]
    if pos.dim() == 2:
        pos = pos[None]
    return [(int(a), int(b)) for a, b in pos[:, 0, :2].to(torch.int64).tolist()]


# -- the cases ----------------------------------------------------------------------------------------------------


def _padded(ids: list[Hashable]) -> Any:
    """The epoch of a reader that pads ranks by repeating samples: each once, and -n % world_size repeats."""
    return lambda world_size: Epoch(ids, pad=-len(ids) % world_size)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("conformance")
    plain = str(root / "plain.tr")
    write_record(_samples(0, COUNT), plain, seed=1, progress=False)
    sources = []
    first = 0
    for s, n in enumerate(MIX_SIZES):
        sources.append(str(root / f"mix{s}.tr"))
        write_record(_samples(first, n), sources[-1], seed=s, samples_per_record=3 if s else 1, progress=False)
        first += n
    grouped = str(root / "grouped.tr")
    write_record(_frames(), grouped, group_by="seq", seed=2, progress=False)
    write_demo_file(root / "demo.hdf5", DEMOS, seed=2)
    robo = str(root / "demo.tr")
    from_robomimic(root / "demo.hdf5", robo, progress=False)
    seq = SequenceDataset(robo, OBS_KEYS, DATASET_KEYS, seq_length=3)
    windows = [window_ids({"obs": {"pos": torch.from_numpy(seq[i]["obs"]["pos"])}})[0] for i in range(len(seq))]
    frames = list(range(sum(LENGTHS)))
    write_lerobot(root / "lerobot", [7, 2, 12, 5, 9, 11], rows_per_file=10)
    robot = str(from_lerobot(root / "lerobot", root / "lerobot.tr", progress=False).path)
    return {
        "RecordDataset": Case(
            "RecordDataset",
            functools.partial(make_record, plain),
            labels,
            _padded(list(range(COUNT))),
            batch_size=16,
        ),
        "MixedDataset": Case(
            # weights "size", stop "all_once": the epoch is every sample of every source once
            "MixedDataset",
            functools.partial(make_mixed, sources),
            labels,
            _padded(list(range(sum(MIX_SIZES)))),
            batch_size=16,
        ),
        "StreamDataset": Case(
            # tail "pad": every frame once over the ranks' streams, padding cells masked out
            "StreamDataset",
            functools.partial(make_stream, grouped),
            stream_labels,
            lambda world_size: Epoch(frames),
            modes=(BATCH,),
            batch_size=3,
            len_sizes=(1, 3, 5),
        ),
        "WindowDataset": Case(
            # SequenceDataset's windows, each once, ranks padded like RecordDataset
            "WindowDataset",
            functools.partial(make_window, robo),
            window_ids,
            _padded(windows),
            batch_size=8,
        ),
        "LeRobotStreamDataset": Case(
            # LeRobotDataset's items (46 frames), each once, ranks padded like RecordDataset
            "LeRobotStreamDataset",
            functools.partial(make_lerobot, robot),
            frame_indices,
            _padded(list(range(46))),
            batch_size=8,
        ),
        "BatchIter": Case(
            "BatchIter",
            functools.partial(make_batch_iter, plain),
            labels,
            lambda world_size: Epoch(list(range(COUNT))),
            modes=(BATCH,),
            batch_size=16,
            dataloader=False,
            distributed=False,
        ),
        "GroupBatchIter": Case(
            "GroupBatchIter",
            functools.partial(make_group_batch_iter, grouped),
            labels,
            lambda world_size: Epoch(frames),
            modes=(BATCH,),
            batch_size=3,
            dataloader=False,
            distributed=False,
            len_sizes=(1, 5, 7),
        ),
    }


#: (case, check) -> why it fails today. Strict: a closed gap fails until its line is removed.
GAPS: dict[tuple[str, str], str] = {}
for _name in ("BatchIter", "GroupBatchIter"):
    GAPS[(_name, "pickling")] = (
        f"{_name} does not pickle: Columns keeps its batch builders as closures "
        "(torchrecord/_memory/columns.py _container and _leaf_at)"
    )

CASES = (
    "RecordDataset",
    "MixedDataset",
    "StreamDataset",
    "WindowDataset",
    "LeRobotStreamDataset",
    "BatchIter",
    "GroupBatchIter",
)


@pytest.fixture(scope="module")
def spawned() -> Any:
    """The spawned process every case's state_in_another_process check resumes in (started once)."""
    with conformance.spawn_pool() as pool:
        yield pool


@pytest.mark.parametrize(
    ("case", "check"),
    [
        pytest.param(c, k, marks=pytest.mark.xfail(strict=True, reason=GAPS[(c, k)])) if (c, k) in GAPS else (c, k)
        for c in CASES
        for k in conformance.CHECKS
    ],
)
def test_reader_contract(cases: dict[str, Case], case: str, check: str, request: pytest.FixtureRequest) -> None:
    pool = request.getfixturevalue("spawned") if check == "state_in_another_process" else None
    conformance.check_reader_contract(cases[case], [check], pool=pool)


# -- the helper catches what it is for ------------------------------------------------------------------------


class Toy(torch.utils.data.IterableDataset[int]):
    """0..n-1 in a seeded order per epoch over ranks and workers, with a resume point; ``broken`` breaks one part.

    ``broken``: ``"workers"`` (every worker yields the whole share), ``"epoch"`` (the epoch
    is a plain int: persistent workers keep the one they were started with), ``"resume"``
    (a resumed reader skips one item too many).
    """

    def __init__(self, n: int = 40, *, rank: int = 0, world_size: int = 1, batch_size: None = None, broken: str = ""):
        self.n, self.rank, self.world_size, self.broken = n, rank, world_size, broken
        self._epoch = torch.zeros((), dtype=torch.int64)
        if broken != "epoch":
            self._epoch.share_memory_()
        self._skip = 0
        self._yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)

    def __len__(self) -> int:
        return -(-self.n // self.world_size)

    def _share(self) -> list[int]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(int(self._epoch))).tolist()
        order += order[: len(self) * self.world_size - self.n]  # pad by repeating the epoch's start
        mine = order[self.rank :: self.world_size]
        info = torch.utils.data.get_worker_info()
        if info is None or self.broken == "workers":
            return mine
        return mine[info.id :: info.num_workers]

    def __iter__(self) -> Any:
        start, self._skip = self._skip, 0
        self._yielded = start
        for x in self._share()[start:]:
            self._yielded += 1
            yield x

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self._epoch), "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._skip = state["yielded"] + (1 if self.broken == "resume" else 0)


def make_toy(**kw: Any) -> Toy:
    return Toy(**kw)


def toy_ids(item: Any) -> list[Hashable]:
    return [int(x) for x in torch.as_tensor(item).reshape(-1).tolist()]


def toy_case(broken: str = "") -> Case:
    return Case(
        f"Toy({broken or 'sound'})",
        functools.partial(make_toy, broken=broken),
        toy_ids,
        _padded(list(range(40))),
        modes=(conformance.SAMPLE,),
        batch_size=4,
    )


def test_the_checks_pass_a_sound_reader() -> None:
    conformance.check_reader_contract(toy_case(), ["exactly_once", "set_epoch", "state_round_trip"])


@pytest.mark.parametrize(
    ("broken", "check", "message"),
    [
        ("workers", "exactly_once", "repeated samples"),
        ("epoch", "set_epoch", "did not reach the workers"),
        ("resume", "state_round_trip", "the resumed reader yields"),
    ],
)
def test_the_checks_catch_a_broken_reader(broken: str, check: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        conformance.check_reader_contract(toy_case(broken), [check])
