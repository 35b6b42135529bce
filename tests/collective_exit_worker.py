"""Run by test_collective_exit.py as gloo ranks: what a collective reader leaves behind after its builds and
its close (tensors it handed to gloo, threads)."""

from __future__ import annotations

import os
import sys
import threading

import torch.distributed as dist

from rank_dataset import RankDataset
from tests_helpers import write_rank_result


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main(meta: str, packed: str, out: str) -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    result: dict[str, object] = {"python_threads": threading.active_count()}
    before = os_threads()
    # On the world's gloo group (no group of its own): a text file and a gzip one (whose checkpoints rank 0
    # reads and broadcasts), two builds.
    ds = RankDataset([meta, packed], reader="collective", reload_cfg={"seed": 2})
    ds.set_epoch(1)
    result["shared_group"] = {
        "pending": ds.reader.pending(),
        "threads_added": os_threads() - before,
        "python_threads": threading.active_count(),
        "samples": len(ds),
    }
    ds.close()
    # With a timeout the reader makes a gloo group of its own: its threads end at close.
    ds = RankDataset(meta, reader="collective", timeout=120)
    ds.set_epoch(1)
    built = {"pending": ds.reader.pending(), "threads_added": os_threads() - before}
    ds.close()
    built["threads_after_close"] = os_threads() - before
    result["own_group"] = built
    write_rank_result(out, result)


if __name__ == "__main__":
    main(*sys.argv[1:4])
