"""Run by test_provenance_distributed.py as a gloo job: one rank of a run by steps through DataLoader workers that
stops (saving its state) or resumes that state under another mix (``remix=True``), with skipped ranges before and
after the edit; rank 0 writes the run's manifest at the end of the resumed part."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import StepSampler
from remix_mixes import edited_dataset
from tests_helpers import write_rank_result

BATCH = 8
CFG = {"mini_epoch": 2, "seed": 7}
LIVE = (7, 15, 17)  # in the resumed part, at loop step 7 skip data batches [15, 17): past the loader's prefetch


def main(mix: str, folder: str, out: str, state_path: str, last: int) -> None:
    dist.init_process_group("gloo")
    ds = edited_dataset(mix, folder, CFG)
    sampler = StepSampler(ds, BATCH, skip=[(2, 3)] if mix == "before" else None)
    if mix == "after":
        with open(state_path) as f:
            sampler.load_state_dict(json.load(f), remix=True)
    start = sampler.step
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=list, num_workers=2, persistent_workers=True)
    batches = []
    for step, batch in zip(range(start, last), loader):
        batches.append(batch)
        if mix == "after" and step == LIVE[0]:
            sampler.skip(*LIVE[1:])
    if dist.get_rank() == 0:
        if mix == "before":  # the job stops here: save where it is
            with open(state_path, "w") as f:
                json.dump(sampler.state_dict(step=last), f)
        else:
            sampler.manifest(f"{out}.manifest.json")
    write_rank_result(out, {"start": start, "batches": batches, "consumed": sampler.consumed(step=last)})


if __name__ == "__main__":
    mix, folder, out, state, last = sys.argv[1:6]
    main(mix, folder, out, state, int(last))
