"""examples/lightning_train.py: 2 DDP ranks on CPU, set_epoch each epoch, a mid-epoch stop and a resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tests.engines.examples import run_example
from torchrecord import RecordDataset

pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning: pip install -e '.[lightning]'")

pytestmark = pytest.mark.engines

COUNT, BATCH, RANKS, WORKERS = 96, 8, 2, 2  # 6 batches per rank and epoch
STOP = 9  # steps: all 6 of epoch 0, then 3 of epoch 1

Seen = dict[int, list[tuple[int, int, list[int]]]]


def _seen(folder: Path) -> Seen:
    """rank -> [(epoch, batch index, labels)] in the order the rank trained on them."""
    seen: Seen = {}
    for rank in range(RANKS):
        lines = (folder / f"rank-{rank}.txt").read_text().splitlines()
        seen[rank] = [(int(e), int(b), [int(v) for v in rest]) for e, b, *rest in map(str.split, lines)]
    return seen


def _expected(path: Path, rank: int, epoch: int) -> list[list[int]]:
    """The batches rank `rank` reads in `epoch`, by a plain DataLoader of the same settings."""
    ds = RecordDataset(path, batch_size=BATCH, rank=rank, world_size=RANKS)
    ds.set_epoch(epoch)
    return [labels.tolist() for _, labels in DataLoader(ds, batch_size=None, num_workers=WORKERS)]


def test_lightning_ddp_resumes_mid_epoch_with_the_rest_of_the_epoch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    common = ["--count", str(COUNT), "--batch-size", str(BATCH), "--devices", str(RANKS)]
    common += ["--num-workers", str(WORKERS), "--epochs", "2", "--checkpoint-every", str(STOP)]
    first = run_example("lightning_train", str(out), *common, "--max-steps", str(STOP),
                        "--log-samples", str(tmp_path / "seen1"), timeout=600)  # fmt: skip
    assert f"stopped at step {STOP}" in first
    checkpoint = out / "checkpoints" / f"step={STOP}.ckpt"
    # the checkpoint (rank 0's file) holds the position of every rank and worker, mid-epoch 1
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(saved) == 1 and saved[0]["batches"] == STOP - 6
    position = saved[0]["position"]
    assert position["epoch"] == 1 and sorted((r, w) for r, w, *_ in position["readers"]) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]

    resumed = run_example("lightning_train", str(out), *common, "--resume", str(checkpoint),
                          "--log-samples", str(tmp_path / "seen2"), timeout=600)  # fmt: skip
    assert "stopped at step 12" in resumed

    before, after = _seen(tmp_path / "seen1"), _seen(tmp_path / "seen2")
    path = out / "train.tr"
    per_epoch: dict[int, list[int]] = {0: [], 1: []}
    for rank in range(RANKS):
        epoch0, epoch1 = _expected(path, rank, 0), _expected(path, rank, 1)
        assert len(epoch0) == len(epoch1) == 6
        assert epoch0 != epoch1, "set_epoch reached the loader: epoch 1 has another order"
        assert before[rank] == [(0, b, epoch0[b]) for b in range(6)] + [(1, b, epoch1[b]) for b in range(3)]
        # the resumed run trains on exactly the rest of epoch 1, in order, and nothing else
        assert after[rank] == [(1, b, epoch1[b]) for b in range(3, 6)]
        for epoch, _, labels in before[rank] + after[rank]:
            per_epoch[epoch] += labels
    # the ranks together see every sample once per epoch
    assert sorted(per_epoch[0]) == sorted(per_epoch[1]) == list(range(COUNT))
