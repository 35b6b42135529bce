"""Run by test_provenance_distributed.py as a gloo job: one rank reading a mix by steps through DataLoader workers,
with a skipped range given at construction and one at run time; rank 0 writes the run's manifest at the end."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler
from tests_helpers import write_rank_result

SCHEDULE = {0: 4, 3: 8, 6: 16}
STEPS = 14
LIVE = (5, 15, 18)  # at loop step 5, skip data batches [15, 18): past what the loader's prefetch has drawn


def main(meta: str, other: str, out: str) -> None:
    dist.init_process_group("gloo")
    sources = [Source(meta, ids=np.arange(0, 37, 2), weight=2, name="even"), Source(other, repeat=2, name="docs")]
    ds = RankDataset(sources, reload_cfg={"mini_epoch": 3, "seed": 5, "epoch_size": 40}, audit="error")
    sampler = StepSampler(ds, SCHEDULE, skip=[(2, 4)])
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=list, num_workers=2, persistent_workers=True)
    batches = []
    for step, batch in zip(range(STEPS), loader):
        batches.append(batch)
        if step == LIVE[0]:
            sampler.skip(*LIVE[1:])
    if dist.get_rank() == 0:
        sampler.manifest(f"{out}.manifest.json")
    write_rank_result(out, {"batches": batches, "state": sampler.state_dict(step=STEPS)})


if __name__ == "__main__":
    main(*sys.argv[1:4])
