"""Train with Hugging Face Accelerate on a RankDataset without sharding the data twice.

    torchrun --nproc-per-node 2 examples/accelerate_train.py meta.txt

The rule: pass the model and the optimizer through ``accelerator.prepare``, never the DataLoader.
``prepare(loader)`` shards a loader again (each process keeps one batch in ``world_size``), so every
rank would train on ``1/world_size`` of its own shard, with no error and a normal-looking loss curve.
Batches are moved to the device by hand instead (``send_to_device``).

With ``--reads DIR`` each rank writes the sample numbers it trained on, one JSON line per batch (the
tests read them); ``--prepare-loader`` makes the mistake on purpose, to show what it costs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader

from rank_dataset import RandomSampler, RankDataset


def sample_number(path: str) -> int:
    return int(path.rsplit("_", 1)[1].split(".")[0])  # "img_123.jpg" -> 123


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("meta_file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mini-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--reads", default=None, help="a directory for each rank's sample log")
    parser.add_argument("--prepare-loader", action="store_true", help="the mistake: pass the loader to prepare()")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)  # under torchrun: one process per rank, gloo on CPU
    # Built after the Accelerator, so that the process group exists and each rank finds its rank.
    dataset = RankDataset(args.meta_file, reload_cfg={"mini_epoch": args.mini_epochs, "seed": 0}, parser="label")
    sampler = RandomSampler(dataset, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: it is sharded already
    if args.prepare_loader:
        loader = accelerator.prepare(loader)  # WRONG: shards each rank's shard again

    log = None
    if args.reads:
        os.makedirs(args.reads, exist_ok=True)
        log = open(Path(args.reads) / f"rank{accelerator.process_index}.jsonl", "w")  # noqa: SIM115
    for epoch in range(args.epochs):
        for mini in range(args.mini_epochs):
            dataset.set_epoch(epoch, mini)  # this rank's shard of (epoch, mini-epoch)
            sampler.set_epoch(epoch * args.mini_epochs + mini)
            for paths, labels in loader:
                x = send_to_device(labels, accelerator.device).float().unsqueeze(1)
                loss = torch.nn.functional.mse_loss(model(x), x)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if log is not None:
                    ids = [sample_number(p) for p in paths]
                    log.write(json.dumps({"epoch": epoch, "mini": mini, "ids": ids}) + "\n")
    if log is not None:
        log.close()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"trained {args.epochs} epochs x {args.mini_epochs} mini-epochs on {accelerator.num_processes} processes")


if __name__ == "__main__":
    main()
