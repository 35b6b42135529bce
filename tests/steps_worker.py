"""Run by test_steps_distributed.py under torchrun: one rank of a gloo job reading global batches by steps."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler
from tests_helpers import write_rank_result

SCHEDULE = {0: 8, 4: 16, 9: 32}
CFG = {"mini_epoch": 3, "seed": 5}


def dataset(kind: str, meta: str, reader: str) -> RankDataset:
    """The same dataset as the test's reference (in one process, world size 1)."""
    if kind == "stepmix":  # rules by step (a weight, a choose, a repeat; a fixed weight) and repeated augmentation
        sources = [
            Source(meta, weight={0: 1, 7: 3}, by="step"),
            Source(meta.replace("meta", "other"), choose={0: 6, 10: 30}, by="step"),
            Source(meta.replace("meta", "third"), repeat={0: 1, 5: 0.5}, by="step"),
            Source(meta.replace("meta", "fourth"), weight=1),
        ]
        return RankDataset(sources, reload_cfg={**CFG, "epoch_size": 150, "aug_repeats": 2}, reader=reader)
    if kind == "mix":
        sources = [Source(meta, weight=2), Source(meta.replace("meta", "other"), repeat=2)]
        return RankDataset(sources, reload_cfg={**CFG, "epoch_size": 120}, reader=reader)
    return RankDataset(meta, reload_cfg=CFG, reader=reader)


def as_list(batch: list[str]) -> list[str]:
    return list(batch)


def main(kind: str, meta: str, reader: str, out: str, first: int, last: int, state_path: str) -> None:
    dist.init_process_group("gloo")
    ds = dataset(kind, meta, reader)
    sampler = StepSampler(ds, SCHEDULE)
    if state_path != "-" and first > 0:
        with open(state_path) as f:
            sampler.load_state_dict(json.load(f))  # resumed: the step comes from the state
    start = sampler.step
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=1, persistent_workers=True)
    batches = [batch for _, batch in zip(range(start, last), loader)]
    if state_path != "-" and first == 0 and dist.get_rank() == 0:  # the job stops here: save where it is
        with open(state_path, "w") as f:
            json.dump(sampler.state_dict(step=last), f)
    write_rank_result(out, {"start": start, "batches": batches, "world_size": dist.get_world_size()})


if __name__ == "__main__":
    kind, meta, reader, out, first, last, state = sys.argv[1:8]
    main(kind, meta, reader, out, int(first), int(last), state)
