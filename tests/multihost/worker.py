"""Run by the bed's tests under torchrun on every host: one rank of a gloo job across the bed's hosts.

Modes:

- ``shards OUT READERS META URL SERVER``: for each reader of ``READERS`` (comma-separated: ``file`` and
  ``collective`` of the shared directory's ``META``, ``server`` of the meta server at ``SERVER``,
  ``object-file`` and ``object-collective`` of the object ``URL``), the digest of this rank's samples at
  epochs 0 and 1; for the collective readers, the bytes this rank read (``read_chars``) and, on rank 0, the
  store's counts (the bed's proxy) in epoch 1's ``set_epoch`` alone.
- ``slow OUT META SLOW_HOST``: a monitored DataLoader whose transform sleeps 20 ms an item on the ranks of
  host ``SLOW_HOST``; the summaries.

Each rank writes ``OUT.<rank>.json`` with its host name, its global and its local rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import urllib.request
from typing import Any

import psutil
import torch.distributed as dist
from torch.utils.data import DataLoader

import rank_dataset
from rank_dataset import RandomSampler, RankDataset, RankServerDataset
from tests_helpers import write_rank_result

SEED = 5
SLOW_SECONDS = 0.02


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


def shards(out: str, readers: str, meta: str, url: str, server: str) -> None:
    dist.init_process_group("gloo")
    me = psutil.Process()
    result: dict[str, Any] = {}
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
    {"shards": shards, "slow": slow}[mode](*args)
