"""Run by test_steps_shapes.py under torchrun: one rank of a gloo job reading batches by shape (bucketed or
budgeted) through a DataLoader with two fork workers or one spawn worker."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, StepSampler
from steps_worker import as_list
from tests_helpers import spawn_workers, write_rank_result

N = 61
CFG = {"mini_epoch": 3, "seed": 5}
BUCKETS = np.arange(N) % 3
COST = (np.arange(N) * 7) % 10 + 1
SHAPES = {"bucket": {"size": 6, "bucket_by": BUCKETS}, "budget": {"size": None, "max_cost": 30, "cost": COST}}


def sampler(ds: RankDataset, kind: str) -> StepSampler:
    shape = dict(SHAPES[kind])
    return StepSampler(ds, shape.pop("size"), **shape)


def main(kind: str, meta: str, context: str, out: str, steps: int) -> None:
    dist.init_process_group("gloo")
    ds = RankDataset(meta, reload_cfg=CFG)
    loader = DataLoader(
        ds, batch_sampler=sampler(ds, kind), collate_fn=as_list, num_workers=spawn_workers(context),
        multiprocessing_context=context,
    )  # fmt: skip
    batches = [batch for _, batch in zip(range(steps), loader)]
    write_rank_result(out, {"batches": batches, "world_size": dist.get_world_size()})


if __name__ == "__main__":
    kind, meta, context, out, steps = sys.argv[1:6]
    main(kind, meta, context, out, int(steps))
