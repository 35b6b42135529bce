"""Run by test_resume_distributed.py as gloo ranks: train until killed (under torchrun), or resume and finish
(as forks of one process, tests/ranks.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset

BATCH = 10


def sample_number(line: str) -> int:
    """The sample number in a line ``img_<i>.JPEG <label>`` of the test's meta file."""
    return int(line.split("_", 1)[1].split(".", 1)[0])


def main(meta: str, workdir: str, phase: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(workdir)
    ds = RankDataset(meta, reload_cfg={"mini_epoch": 2, "seed": 4})
    if phase == "first":
        with open(work / f"consumed.{rank}.jsonl", "w") as log:
            for step, lines in enumerate(DataLoader(ds, batch_size=BATCH, num_workers=1)):
                samples = [sample_number(line) for line in lines]
                log.write(json.dumps({"step": step, "samples": samples}) + "\n")
                log.flush()
                if step == 3 and rank == 0:  # the checkpoint after 4 steps
                    tmp = work / "state.tmp"
                    tmp.write_text(json.dumps(ds.state_dict(consumed=(step + 1) * BATCH)))
                    os.replace(tmp, work / "state.json")
                dist.barrier()
                if step >= 5:
                    time.sleep(3600)  # still "training" when the test kills the job
        raise SystemExit("the first run was meant to be killed mid-epoch")
    ds.load_state_dict(json.loads((work / "state.json").read_text()))
    lengths: list[int] = []
    seen: list[int] = []
    for mini in range(ds.reload_cfg.mini_epoch_idx, ds.reload_cfg.mini_epoch):
        if mini != ds.reload_cfg.mini_epoch_idx:
            ds.set_epoch(0, mini)
        loader = DataLoader(ds, batch_size=BATCH, num_workers=1)
        lengths.append(len(ds))
        seen.extend(sample_number(line) for batch in loader for line in batch)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"lengths": lengths, "samples": seen})
    if rank == 0:
        (work / f"after.{world}.json").write_text(json.dumps(gathered))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
