"""Run by test_distributed.py under torchrun: one rank of a 3-rank gloo job."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RandomSampler, RankDataset
from tests_helpers import write_rank_result


def main(meta: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, object] = {"rank": rank, "world_size": dist.get_world_size()}
    for mini in range(2):
        # No rank or world size given: the dataset finds them in the process group.
        ds = RankDataset(meta, reload_cfg={"mini_epoch": 2, "seed": 11, "epoch": 3, "mini_epoch_idx": mini})
        gathered: list[list[int]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, ds.indices.tolist())
        result[f"indices_{mini}"] = gathered
        if rank == 1:
            loader = DataLoader(ds, batch_size=50, sampler=RandomSampler(ds, seed=mini), num_workers=2)
            items = [line for batch in loader for line in batch]
            result[f"loader_{mini}"] = items
            result[f"expected_{mini}"] = [ds.meta[int(i)] for i in np.asarray(ds.indices)]
    write_rank_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
