"""Run by test_steps_remix.py under torchrun: one rank of a gloo job by steps, through DataLoader workers, that
stops (saving its state) or resumes a state under another mix (``remix=True``)."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import StepSampler
from remix_mixes import edited_dataset
from tests_helpers import write_rank_result

BATCH = 12
CFG = {"mini_epoch": 2, "seed": 3}


def main(mix: str, folder: str, out: str, state_path: str, last: int) -> None:
    dist.init_process_group("gloo")
    ds = edited_dataset(mix, folder, CFG)
    sampler = StepSampler(ds, BATCH)
    if mix == "after":
        with open(state_path) as f:
            sampler.load_state_dict(json.load(f), remix=True)
    start = sampler.step
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=list, num_workers=2, persistent_workers=True)
    batches = [batch for _, batch in zip(range(start, last), loader)]
    if mix == "before" and dist.get_rank() == 0:  # the job stops here: save where it is
        with open(state_path, "w") as f:
            json.dump(sampler.state_dict(step=last), f)
    dropped = {e.step: e.dropped for e in sampler.edits}
    write_rank_result(out, {"start": start, "batches": batches, "dropped": {str(k): v for k, v in dropped.items()}})


if __name__ == "__main__":
    mix, folder, out, state, last = sys.argv[1:6]
    main(mix, folder, out, state, int(last))
