"""Run by test_shared_batches.py: one rank of a 4-rank gloo job laid out as 2 data-parallel replicas x 2
tensor-parallel ranks (a DeviceMesh), each replica's loader iterated on its first tensor-parallel rank only and
its batches shared with the other through ``shared_batches``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import sys
from collections import namedtuple
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, ResumableSampler, StepSampler, shared_batches
from tests_helpers import write_rank_result

CFG = {"mini_epoch": 2, "seed": 3}
GLOBAL_BATCH = 8  # 4 a data-parallel replica
STEPS, STOP = 12, 5  # the straight run's steps; the resumed run starts at STOP

Pair = namedtuple("Pair", ["first", "second"])


def collate(items: list[str]) -> dict[str, Any]:
    """A batch of every kind: tensors nested in a dict, a list, a tuple and a named tuple, and plain objects."""
    numbers = torch.tensor([int(s.split()[0].split("_")[1].split(".")[0]) for s in items], dtype=torch.int64)
    return {
        "lines": list(items),
        "numbers": numbers,
        "nested": [numbers.float() / 7, (numbers.view(-1, 1).repeat(1, 3).to(torch.int16), "tag")],
        "pair": Pair(numbers[:2].clone(), {"n": len(items)}),
    }


def summary(batch: dict[str, Any]) -> dict[str, Any]:
    """What the test compares: every leaf of the batch, tensors as dtype, shape and values."""
    nested_f, (nested_i, tag) = batch["nested"]
    pair = batch["pair"]
    assert isinstance(pair, Pair), type(pair)
    return {
        "lines": batch["lines"],
        "numbers": batch["numbers"].tolist(),
        "f": [str(nested_f.dtype), nested_f.tolist()],
        "i": [str(nested_i.dtype), list(nested_i.shape), nested_i.tolist()],
        "tag": tag,
        "pair": [pair.first.tolist(), pair.second],
    }


def opened(meta: str) -> dict[str, int]:
    """What this process has open: descriptors on the meta file, shard segments (memfd or /dev/shm), children."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        children = len(f.read().split())
    return {
        "meta_fds": sum(os.path.realpath(meta) == link for link in links),
        "segments": sum("memfd:" in link or link.startswith("/dev/shm/") for link in links),
        "children": children,
    }


def usage() -> dict[str, float]:
    """CPU seconds (this process and its reaped children: the DataLoader workers) and PSS in MiB."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    with open("/proc/self/smaps_rollup") as f:
        pss = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    return {"cpu_s": cpu, "pss_mib": pss / 1024}


def loader_of(meta: str, dp_group: Any, epoch_layout: bool) -> DataLoader[Any]:
    """A replica's loader, over its share of the samples (the data-parallel group), with 2 workers."""
    ds = RankDataset(meta, reload_cfg=CFG, group=dp_group)
    if epoch_layout:
        ds.set_epoch(0)
        return DataLoader(ds, sampler=ResumableSampler(ds), batch_size=3, collate_fn=collate, num_workers=2)
    sampler = StepSampler(ds, GLOBAL_BATCH)
    return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2)


class Failing:
    """A loader that raises at its third batch."""

    def __iter__(self) -> Any:
        for i in range(2):
            yield {"x": torch.full((2,), i)}
        raise OSError("the disk went away")


def main(meta: str, out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh["tp"], mesh["dp"]
    first = tp.get_local_rank() == 0
    result: dict[str, Any] = {"dp": dp.get_local_rank(), "tp": tp.get_local_rank()}
    before = usage()

    # The step layout, straight: the mesh dimension given as the group.
    # Elsewhere: None on replica 0, a loader that must never be iterated on replica 1.
    loader = loader_of(meta, dp.get_group(), False) if first else (None if dp.get_local_rank() == 0 else Failing())
    batches = shared_batches(loader, tp)
    result["straight"] = []
    for step, batch in zip(range(STEPS), batches):
        result["straight"].append(summary(batch))
        if step == 3:  # the loader's workers running on the first rank
            result["during"] = opened(meta)
    state = batches.state_dict(step=STOP)
    result["state"] = state
    if first:
        del loader, batches  # its workers end

    # Resumed at STOP from that state (as any rank of the group saved it): the ProcessGroup given.
    loader = loader_of(meta, dp.get_group(), False) if first else None
    batches = shared_batches(loader, tp.get_group())
    batches.load_state_dict(state)
    result["resumed"] = [summary(b) for _, b in zip(range(STOP, STEPS), batches)]

    # The epoch layout (a mini-epoch's shard) to its end: every rank's iteration ends together.
    loader = loader_of(meta, dp.get_group(), True) if first else None
    batches = shared_batches(loader, tp)
    result["length"] = len(batches)
    result["epoch"] = [summary(b) for b in batches]
    result["after"] = opened(meta)
    result["usage"] = {k: usage()[k] - (before[k] if k == "cpu_s" else 0) for k in before}

    # A loader that fails on the first rank fails every rank of the group, naming the error.
    try:
        for _ in shared_batches(Failing() if first else None, tp):
            pass
    except (OSError, RuntimeError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    # A loader with no resume state: the first rank's error, raised on every rank of the group.
    try:
        shared_batches(Failing() if first else None, tp).state_dict()
    except ValueError as exc:
        result["no_state"] = str(exc)
    digest = hashlib.sha256(repr(result["straight"]).encode()).hexdigest()
    result["digest"] = digest
    write_rank_result(out, result)


if __name__ == "__main__":
    main(*sys.argv[1:3])
