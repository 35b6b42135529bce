"""Run by test_monitor.py under torchrun: one rank of a gloo job iterating a monitored DataLoader.

Modes: ``slow`` (rank 2's transform sleeps 20 ms an item), ``hang`` (worker 1 of rank 1 hangs, for a bounded
time, in its first item), ``clean`` (every rank alike, for ``steps`` steps over several epochs) and
``collective`` (the collective reader: the summary on its gloo group, its exchange timed) and ``sources`` (a
StepSampler over a mix of the meta file and a second one: each summary's samples by source) and ``group`` (the
dataset on a data-parallel group of every other rank: the summary is that group's).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

import rank_dataset
from rank_dataset import RandomSampler, RankDataset, Source, StepSampler
from tests_helpers import write_rank_result

SLOW_RANK = 2
HANG_RANK, HANG_WORKER, HANG_SECONDS = 1, 1, 14.0
_hung = False


def slow_transform(line: str) -> str:
    time.sleep(0.02)
    return line


def light_transform(line: str) -> str:
    time.sleep(0.0005)
    return line


def hang_transform(line: str) -> str:
    """Hangs once in worker HANG_WORKER (bounded, so that the job ends by itself after the check)."""
    global _hung
    info = get_worker_info()
    if info is not None and info.id == HANG_WORKER and not _hung:
        _hung = True
        time.sleep(HANG_SECONDS)
    return line


def collate(batch: list[Any]) -> list[Any]:
    return batch


def main(mode: str, meta: str, out: str, run_dir: str, steps: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    transform = {
        "slow": slow_transform if rank == SLOW_RANK else None,
        "hang": hang_transform if rank == HANG_RANK else None,
        "clean": light_transform,
        "collective": None,
        "sources": None,
        "group": None,
    }[mode]
    reader = "collective" if mode == "collective" else "file"
    workers = 2 if mode == "hang" else 1
    if mode == "sources":
        other = f"{meta}.other"
        if rank == 0:
            with open(other, "w") as f:
                f.writelines(f"doc_{i}.txt\n" for i in range(37))
        dist.barrier()
        mix = [Source(meta, weight=3), Source(other, weight=1)]
        ds = RankDataset(mix, reload_cfg={"seed": 3, "epoch_size": 200})
        loader = DataLoader(ds, batch_sampler=StepSampler(ds, 8), num_workers=workers, collate_fn=collate)
    else:
        group = None
        if mode == "group":  # two data-parallel groups, {0, 2} and {1, 3}: each rank makes both
            groups = [dist.new_group([r for r in range(dist.get_world_size()) if r % 2 == k]) for k in (0, 1)]
            group = groups[rank % 2]
        ds = RankDataset(meta, reload_cfg={"seed": 3}, transform=transform, reader=reader, group=group)
        size = 2 if mode == "slow" else 4
        loader = DataLoader(ds, batch_size=size, sampler=RandomSampler(ds), num_workers=workers, collate_fn=collate)
    every = {"slow": 10, "hang": 10_000, "clean": 100, "collective": 10, "sources": 10, "group": 10}[mode]
    pause = {"slow": 0.005, "hang": 0.0, "clean": 0.01, "collective": 0.0, "sources": 0.0, "group": 0.0}[mode]
    summaries: list[dict[str, Any]] = []
    step, total, epoch = 0, int(steps), 0
    started = time.monotonic()
    with rank_dataset.monitor(loader, every=every, out=run_dir, stall_after=2.0 if mode == "hang" else 10.0) as m:
        while step < total:
            ds.set_epoch(epoch)
            for _batch in m:
                step += 1
                time.sleep(pause)  # the training step
                latest = m.summary()
                if latest is not None and (not summaries or summaries[-1]["step"] != latest["step"]):
                    summaries.append(latest)
                if step == total:
                    break
            epoch += 1
        stalls = m.stalls
    result = {"rank": rank, "summaries": summaries, "stalls": stalls, "seconds": time.monotonic() - started}
    if mode == "sources":
        result["consumed"] = loader.batch_sampler.consumed(step=total)
    if mode == "collective":
        ds.close()
    write_rank_result(out, result)


if __name__ == "__main__":
    main(*sys.argv[1:6])
