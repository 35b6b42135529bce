"""Run by test_bucket_batch_sampler.py under run_ranks: one rank of a gloo job reading BucketBatchSampler's batches
through a DataLoader with two fork workers (or one spawn worker), over two epochs of two mini-epochs."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import BucketBatchSampler, RankDataset
from tests_helpers import spawn_workers, write_rank_result

N = 97
CFG = {"mini_epoch": 2, "seed": 3}
BUCKETS = (np.arange(N) * 5) % 4
BATCH = 3


def as_list(batch: list[str]) -> list[str]:
    return list(batch)


def main(meta: str, context: str, out: str, drop_last: str) -> None:
    dist.init_process_group("gloo")
    ds = RankDataset(meta, reload_cfg=CFG)
    sampler = BucketBatchSampler(ds, BATCH, bucket_by=BUCKETS, drop_last=drop_last == "1")
    workers = spawn_workers(context)  # under spawn, one for each of the four loaders
    loader = DataLoader(
        ds, batch_sampler=sampler, collate_fn=as_list, num_workers=workers, multiprocessing_context=context
    )
    windows = []
    for epoch in range(2):
        for m in range(2):
            ds.set_epoch(epoch, m)
            windows.append(list(loader))
    write_rank_result(out, {"windows": windows, "world_size": dist.get_world_size()})


if __name__ == "__main__":
    main(*sys.argv[1:5])
