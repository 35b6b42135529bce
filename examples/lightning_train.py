"""Train with lightning.Trainer on a RankDataset: DDP on CPU, epochs and mini-epochs, exact resume.

    python examples/lightning_train.py meta.txt --devices 2 --epochs 2 --mini-epochs 2
    python examples/lightning_train.py meta.txt --devices 2 --stop-at 1:3 --checkpoint stop.ckpt   # "preempted"
    python examples/lightning_train.py meta.txt --devices 3 --resume stop.ckpt                     # the rest

Lightning starts the other processes itself (``strategy="ddp"`` re-runs this script), so the dataset
is built in ``RankDataModule.setup``, once the process group exists. With ``--reads DIR`` each rank
writes the sample numbers it trained on, one JSON line per batch (the tests read them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from rank_dataset import RankDataset
from rank_dataset.training.lightning import RankDataModule


def sample_number(path: str) -> int:
    return int(path.rsplit("_", 1)[1].split(".")[0])  # "img_123.jpg" -> 123


class TinyModel(pl.LightningModule):
    """A linear model of the label; it logs the samples each training step saw."""

    def __init__(self, log_dir: str | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.log_dir = log_dir

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        paths, labels = batch
        if self.log_dir:
            with open(Path(self.log_dir) / f"rank{self.global_rank}.jsonl", "a") as f:
                ids = [sample_number(p) for p in paths]
                f.write(json.dumps({"epoch": self.current_epoch, "batch": batch_idx, "ids": ids}) + "\n")
        x = labels.float().unsqueeze(1)
        return torch.nn.functional.mse_loss(self.layer(x), x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(pl.Callback):
    """Save a checkpoint after batch ``batch`` of epoch ``epoch`` and stop there, like a preemption."""

    def __init__(self, epoch: int, batch: int, path: str) -> None:
        self.epoch, self.batch, self.path = epoch, batch, path

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if trainer.current_epoch == self.epoch and done == self.batch:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("meta_file")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mini-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--stop-at", default=None, help="EPOCH:BATCH (Lightning's epoch) to checkpoint and stop at")
    parser.add_argument("--checkpoint", default="stop.ckpt")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
    parser.add_argument("--reads", default=None, help="a directory for each rank's sample log")
    args = parser.parse_args()
    if args.reads:
        os.makedirs(args.reads, exist_ok=True)

    def build() -> RankDataset:  # called in each process once the process group exists
        cfg = {"mini_epoch": args.mini_epochs, "seed": 0}
        return RankDataset(args.meta_file, reload_cfg=cfg, parser="label")

    data = RankDataModule(
        build, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=args.workers > 0
    )
    callbacks = []
    if args.stop_at:
        epoch, batch = map(int, args.stop_at.split(":"))
        callbacks.append(StopAt(epoch, batch, args.checkpoint))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",  # gloo on CPU
        use_distributed_sampler=False,  # each rank already holds only its own shard
        max_epochs=args.epochs * args.mini_epochs,  # one Lightning epoch per mini-epoch
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyModel(args.reads), datamodule=data, ckpt_path=args.resume)
    if trainer.global_rank == 0:
        print(f"trained {trainer.current_epoch} epochs on {trainer.world_size} processes, pid {os.getpid()}")


if __name__ == "__main__":
    main()
