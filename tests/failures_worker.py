"""Run by test_bad_samples.py under torchrun: gloo ranks whose transform raises for known samples.

Phase ``full`` runs epochs 0 and 1 (rank 0 saving a resume state after ``STEPS_BEFORE`` steps of
epoch 0); phase ``resume`` loads that state and runs what was left of epoch 0, then epoch 1. Each rank
writes, per epoch, its planned samples and the items of each batch, and the failures it knows of.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import RankDataset
from tests_helpers import write_rank_result

BATCH = 8
STEPS_BEFORE = 5


def is_bad(sample: int) -> bool:
    """The samples whose 'image' cannot be loaded."""
    return sample % 17 == 3


def load(parsed: tuple[str, int]) -> int:
    """The test's transform: the sample number of a line ``img_<i>.JPEG <label>``, or an OSError."""
    sample = int(parsed[0].split("_", 1)[1].split(".", 1)[0])
    if is_bad(sample):
        raise OSError(f"image file is truncated (sample {sample})")
    return sample


def run_epoch(ds: RankDataset, method: str) -> dict[str, object]:
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context=method)
    planned = ds.indices.tolist()
    return {"planned": planned, "steps": [batch.tolist() for batch in loader], "length": len(ds)}


def main(meta: str, out: str, phase: str, method: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    work = Path(out).parent
    ds = RankDataset(
        meta,
        reload_cfg={"seed": 5},
        parser="label",
        transform=load,
        on_error="replace",
        max_failures=None,
        exclude_failures=True,
    )
    result: dict[str, object] = {"rank": rank, "world_size": dist.get_world_size()}
    if phase == "full":
        epoch0 = run_epoch(ds, method)
        state = ds.state_dict(consumed=STEPS_BEFORE * BATCH)  # a collective with exclude_failures
        if rank == 0:
            (work / "state.json").write_text(json.dumps(state))
    else:
        ds.load_state_dict(json.loads((work / "state.json").read_text()))
        epoch0 = run_epoch(ds, method)
    result["epoch0"] = epoch0
    failures_epoch0 = [f.sample for f in ds.failures]  # this rank's (and, after a resume, the state's)
    ds.set_epoch(1)
    result["excluded"] = list(ds.excluded_failures)
    result["epoch1"] = run_epoch(ds, method)
    result["failures"] = failures_epoch0
    result["where"] = {str(f.sample): f.where for f in ds.failures}
    result["errors"] = {str(f.sample): f.error for f in ds.failures}
    write_rank_result(out, result)


if __name__ == "__main__":
    main(*sys.argv[1:5])
