"""Run by test_distributed.py as gloo ranks (tests/ranks.py): one rank of a 4-rank gloo job with aug_repeats=2."""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, ResumableSampler
from tests_helpers import write_rank_result


def main(meta: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, object] = {"rank": rank, "world_size": dist.get_world_size()}
    # No rank or world size given: the dataset finds them in the process group.
    ds = RankDataset(meta, reload_cfg={"mini_epoch": 2, "seed": 7, "aug_repeats": 2})
    for epoch in range(2):
        for mini in range(2):
            ds.set_epoch(epoch, mini)
            # In order through two workers, the way repeated augmentation is meant to be read.
            loader = DataLoader(ds, batch_size=8, sampler=ResumableSampler(ds), num_workers=2)
            steps = [list(batch) for batch in loader]
            gathered: list[list[list[str]]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(gathered, steps)
            result[f"steps_{epoch}_{mini}"] = gathered
            result[f"indices_{epoch}_{mini}"] = ds.indices.tolist()
    write_rank_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
