"""Train with PyTorch Lightning from a record set: DDP ranks, set_epoch, mid-epoch resume.

Needs pytorch-lightning (``pip install 'pytorch-lightning>=2.4'``, or the
``lightning`` extra); it is not a dependency of torchrecord. What it shows:

* ``RecordDataModule``: a ``LightningDataModule`` over a ``RecordDataset``. Its
  ``prepare_data`` writes the set once (on local rank 0), ``setup`` opens it on
  every rank (after DDP started, so the dataset reads this rank's share), and
  ``train_dataloader`` returns a ``torchrecord.RecordLoader``.
* ``SetEpoch``: a callback that calls ``set_epoch`` at the start of every epoch
  (Lightning calls ``set_epoch`` on a loader's *sampler* only, and an iterable
  dataset has none), before the epoch's loader iterator (and its workers) start.
* ``torchrecord.RecordLoader``: a DataLoader whose ``state_dict`` Lightning saves
  in its checkpoints and restores on resume. Lightning writes the checkpoint of
  rank 0 only and loads that one file on every rank, so a per-rank loader state
  cannot resume rank 1 (``RecordDataset`` refuses another reader's state). The
  RecordLoader's state is every rank's position, gathered over torch.distributed
  and merged with ``torchrecord.loader_position``; each rank resumes its own
  share of that one position: exactly the rest of the epoch, in the same order.

    python examples/lightning_train.py runs/demo                             # 2 CPU ranks (DDP), 2 epochs of 6 steps
    python examples/lightning_train.py runs/demo --max-steps 9 --checkpoint-every 9     # stop mid-epoch 1
    python examples/lightning_train.py runs/demo --checkpoint-every 9 --resume runs/demo/checkpoints/step=9.ckpt

``--log-samples DIR`` appends the label of every sample each rank trains on to
``DIR/rank-R.txt`` (one line per batch: epoch, batch index, labels);
tests/engines/test_lightning.py runs the last two commands above (with it) and checks them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

import torchrecord


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A stand-in dataset: sample i is (a float32[16] vector of i / n, label i); picklable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((16,), i / self.n), i


# --8<-- [start:datamodule]
class RecordDataModule(pl.LightningDataModule):
    def __init__(self, path: str, *, count: int, batch_size: int, num_workers: int) -> None:
        super().__init__()
        self.path, self.count, self.batch_size, self.num_workers = path, count, batch_size, num_workers
        self.dataset: torchrecord.RecordDataset | None = None

    def prepare_data(self) -> None:  # local rank 0 only; the other ranks wait
        if not os.path.exists(self.path):
            torchrecord.write_record(Squares(self.count), self.path, seed=0, progress=False)

    def setup(self, stage: str) -> None:  # every rank, after DDP started: the dataset reads this rank's share
        self.dataset = torchrecord.RecordDataset(self.path, batch_size=self.batch_size)

    def train_dataloader(self) -> torchrecord.RecordLoader:
        assert self.dataset is not None
        self.dataset.set_epoch(self.trainer.current_epoch if self.trainer is not None else 0)
        # its state_dict is every rank's position, merged: rank 0's checkpoint resumes every rank
        return torchrecord.RecordLoader(self.dataset, num_workers=self.num_workers)


class SetEpoch(pl.Callback):
    """``set_epoch`` on the datamodule's RecordDataset before each epoch's iterator starts."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.datamodule.dataset.set_epoch(trainer.current_epoch)  # type: ignore[attr-defined]


# --8<-- [end:datamodule]


class Regression(pl.LightningModule):
    def __init__(self, log_samples: str | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.log_samples = log_samples

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.log_samples:
            with open(os.path.join(self.log_samples, f"rank-{self.global_rank}.txt"), "a") as f:
                f.write(f"{self.current_epoch} {batch_idx} {' '.join(str(int(v)) for v in y)}\n")
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(1), y.float() / 1000)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", help="the run's folder: the record set, checkpoints/, Lightning's logs")
    parser.add_argument("--count", type=int, default=96, help="samples in the record set (written once)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="CPU processes (DDP ranks)")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: each epoch)")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from (mid-epoch too)")
    parser.add_argument("--log-samples", default=None, help="a folder: each rank appends the labels it trains on")
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    if args.log_samples:
        os.makedirs(args.log_samples, exist_ok=True)
    data = RecordDataModule(
        os.path.join(args.out, "train.tr"), count=args.count, batch_size=args.batch_size, num_workers=args.num_workers
    )
    checkpoints = ModelCheckpoint(
        dirpath=os.path.join(args.out, "checkpoints"),
        filename="{step}",
        every_n_train_steps=args.checkpoint_every or None,
        save_top_k=-1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",  # gloo on CPU
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=[SetEpoch(), checkpoints],
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regression(args.log_samples), datamodule=data, ckpt_path=args.resume)
    if trainer.is_global_zero:
        print(f"stopped at step {trainer.global_step}")


if __name__ == "__main__":
    main()
