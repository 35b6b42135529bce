"""Run by the bed's tests under torchrun on every host: one rank of a gloo job across the bed's hosts.

Modes:

- ``shards OUT READERS META URL SERVER``: for each reader of ``READERS`` (comma-separated: ``file`` and
  ``collective`` of the shared directory's ``META``, ``server`` of the meta server at ``SERVER``,
  ``object-file`` and ``object-collective`` of the object ``URL``), the digest of this rank's samples at
  epochs 0 and 1; for the collective readers, the bytes this rank read (``read_chars``) and, on rank 0, the
  store's counts (the bed's proxy) in epoch 1's ``set_epoch`` alone; ``builds``: the index builds this
  rank made (each a record of the library's logger ``rank_dataset.index``: the meta file and the cache).
- ``train OUT LAYOUT META STATE VICTIM KILL_AT LAST``: training by steps (``LAYOUT`` ``steps``:
  :class:`StepSampler`, global batch :data:`BATCH`, to step ``LAST``) or through epoch 0's first mini-epoch
  (``epoch``: :class:`ResumableSampler`, :data:`EPOCH_BATCH` a rank a step), from the state saved at ``STATE``
  if there is one; each step's batch logged (``OUT.trained.<rank>``) before the step's all-reduce, the state
  saved by rank 0 every :data:`SAVE_EVERY` steps after it (not after an epoch-layout resume). The ranks of
  host ``VICTIM`` stop after step ``KILL_AT - 1`` (it writes ``OUT.victim``) and wait to be killed; the
  others go on into the next step's all-reduce.
- ``slow OUT META SLOW_HOST``: a monitored DataLoader whose transform sleeps 20 ms an item on the ranks of
  host ``SLOW_HOST``; the summaries.

Each rank writes ``OUT.<rank>.json`` with its host name, its global and its local rank.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import rank_dataset
from rank_dataset import RandomSampler, RankDataset, RankServerDataset, ResumableSampler, StepSampler
from tests_helpers import write_rank_result

SEED = 5
SLOW_SECONDS = 0.02
# BATCH divides by 2, 4, 6 and 8 ranks: the worlds of 4 x 2 and 2 x 2 and of their restarts on fewer hosts.
BATCH, EPOCH_BATCH, SAVE_EVERY, CFG = 48, 4, 10, {"seed": SEED, "mini_epoch": 2}


def items_digest(ds: Any) -> str:
    """sha256 of the rank's sample numbers and samples, in order."""
    h = hashlib.sha256(ds.indices.tobytes())
    for i in range(len(ds)):
        h.update(repr(ds[i]).encode())
    return h.hexdigest()


def _store_stats() -> dict[str, Any]:
    with urllib.request.urlopen(f"{os.environ['AWS_ENDPOINT_URL']}/__bed/stats", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def _make(reader: str, meta: str, url: str, server: str) -> Any:
    if reader == "file":
        return RankDataset(meta, reload_cfg={"seed": SEED})
    if reader == "collective":
        return RankDataset(meta, reload_cfg={"seed": SEED}, reader="collective")
    if reader == "server":
        return RankServerDataset(server, reload_cfg={"seed": SEED})
    if reader == "object-file":
        return RankDataset(url, reload_cfg={"seed": SEED})
    if reader == "object-collective":
        return RankDataset(url, reload_cfg={"seed": SEED}, reader="collective")
    raise ValueError(f"unknown reader {reader!r}")


class Builds(logging.Handler):
    """The index builds of this process, as the library records them (one INFO record a build)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[dict[str, str | None]] = []
        index_log = logging.getLogger("rank_dataset.index")
        index_log.setLevel(logging.INFO)
        index_log.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        source, _lines, cache = record.args  # type: ignore[misc]
        self.seen.append({"source": str(source), "cache": None if cache is None else str(cache)})


def shards(out: str, readers: str, meta: str, url: str, server: str) -> None:
    builds = Builds()
    dist.init_process_group("gloo")
    me = psutil.Process()
    result: dict[str, Any] = {"builds": builds.seen}
    for reader in readers.split(","):
        ds = _make(reader, meta, url, server)
        digests = []
        for epoch in range(2):
            if epoch == 1 and reader.endswith("collective"):
                dist.barrier()
                before, store_before = me.io_counters().read_chars, _store_stats() if dist.get_rank() == 0 else {}
                ds.set_epoch(epoch)
                dist.barrier()
                result[f"{reader}/read_chars"] = me.io_counters().read_chars - before
                if dist.get_rank() == 0:
                    result[f"{reader}/store"] = [store_before, _store_stats()]
            else:
                ds.set_epoch(epoch)
            digests.append(items_digest(ds))
        result[reader] = digests
        if hasattr(ds, "close"):
            ds.close()
    finish(out, result)


def train(out: str, layout: str, meta: str, state_path: str, victim: str, kill_at: str, last: str) -> None:
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    ds = RankDataset(meta, reload_cfg=CFG)
    state = None
    if os.path.exists(state_path):  # resumed, on this job's world size
        with open(state_path) as f:
            state = json.load(f)
    if layout == "steps":
        sampler = StepSampler(ds, BATCH)
        if state is not None:
            sampler.load_state_dict(state)
        start = sampler.step
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=list)
    else:  # the epoch layout: epoch 0's first mini-epoch (its rest, resumed), EPOCH_BATCH samples a rank a step
        if state is not None:
            ds.load_state_dict(state)
        else:
            ds.set_epoch(0)
        start = 0
        loader = DataLoader(ds, sampler=ResumableSampler(ds), batch_size=EPOCH_BATCH, collate_fn=list)
    mine = socket.gethostname() == victim
    with open(f"{out}.trained.{rank}", "a") as log:
        for step, batch in zip(range(start, int(last)), loader):
            if mine and step == int(kill_at):  # this host is lost here: it waits to be killed
                if int(os.environ["LOCAL_RANK"]) == 0:
                    Path(f"{out}.victim").write_text(str(step))
                time.sleep(600)
            log.write(json.dumps({"step": step, "world": dist.get_world_size(), "batch": batch}) + "\n")
            log.flush()
            dist.all_reduce(torch.zeros(1))  # the training step's collective: the step is done on every rank
            if rank == 0 and (step + 1) % SAVE_EVERY == 0 and not (layout == "epoch" and state is not None):
                saved = (
                    sampler.state_dict(step=step + 1)
                    if layout == "steps"
                    else ds.state_dict(consumed=(step + 1) * EPOCH_BATCH)
                )
                with open(f"{state_path}.tmp", "w") as f:
                    json.dump(saved, f)
                os.replace(f"{state_path}.tmp", state_path)
    finish(out, {"start": start})


def slow(out: str, meta: str, slow_host: str) -> None:
    dist.init_process_group("gloo")
    mine = socket.gethostname() == slow_host
    ds = RankDataset(meta, reload_cfg={"seed": SEED}, transform=_sleepy if mine else None)
    loader = DataLoader(ds, batch_size=2, sampler=RandomSampler(ds), num_workers=1, collate_fn=_collate)
    summaries: list[dict[str, Any]] = []
    with rank_dataset.monitor(loader, every=10, stall_after=30.0) as m:
        for step, _batch in enumerate(m, 1):
            time.sleep(0.005)  # the training step
            latest = m.summary()
            if latest is not None and (not summaries or summaries[-1]["step"] != latest["step"]):
                summaries.append(latest)
            if step == 60:
                break
    finish(out, {"summaries": summaries})


def _sleepy(line: str) -> str:
    time.sleep(SLOW_SECONDS)
    return line


def _collate(batch: list[Any]) -> list[Any]:
    return batch


def finish(out: str, result: dict[str, Any]) -> None:
    result.update(host=socket.gethostname(), rank=dist.get_rank(), local_rank=int(os.environ["LOCAL_RANK"]))
    write_rank_result(out, result)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"shards": shards, "slow": slow, "train": train}[mode](*args)
