"""Run by test_agree.py under torchrun: one rank of a 2-rank gloo job whose ranks disagree, case by case.

Each case builds (or reloads) a dataset in a way that makes the ranks disagree, records what the rank
raised, then meets the other rank in a barrier: a case that left one rank behind would hang there
(the group's short timeout turns a hang into an error). Writes ``OUT.RANK.json``: case -> outcome.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from rank_dataset import MetaFile, RankDataset, RanksDisagreeError, Source
from rank_dataset.demo.synthetic import imagenet_line
from tests_helpers import write_rank_result


def main(work: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    base = Path(work)
    appended = base / "appended.txt"
    results: dict[str, Any] = {}

    def case(name: str, build: Callable[[], Any]) -> None:
        try:
            build()
            results[name] = {"raised": None}
        except RanksDisagreeError as exc:
            results[name] = {"raised": type(exc).__name__, "message": str(exc), "field": exc.field}
            results[name]["values"] = exc.values
        except Exception as exc:
            results[name] = {"raised": type(exc).__name__, "message": str(exc)}
        dist.barrier()  # both ranks got here: nobody hangs

    # Two ranks, two different files.
    case("different_files", lambda: RankDataset(str(base / f"meta_{rank}.txt")))

    # Two ranks, two different files, read by the collective reader: the ranks disagree on the files' sizes.
    case("different_files_collective", lambda: RankDataset(str(base / f"meta_{rank}.txt"), reader="collective").close())

    # One file, appended to between the start of rank 0 and the start of rank 1.
    if rank == 0:
        early = MetaFile(str(appended))  # 1000 samples
    dist.barrier()
    if rank == 1:
        with open(appended, "a") as f:
            f.write("".join(f"{imagenet_line(i)}\n" for i in range(1000, 1100)))
        early = MetaFile(str(appended))  # 1100 samples
    case("appended", lambda: RankDataset(early))

    # Same file, different seeds.
    case("seed", lambda: RankDataset(str(base / "meta_0.txt"), reload_cfg={"seed": rank}))

    # Both ranks claim a world of 3 in a group of 2.
    case("world_size_vs_group", lambda: RankDataset(str(base / "meta_0.txt"), rank=rank, world_size=3))

    # Both processes claim rank 0 of a world of 2: rank 1 is read by nobody, rank 0 twice.
    case("same_rank", lambda: RankDataset(str(base / "meta_0.txt"), rank=0, world_size=2))

    # Data parallelism over 1 rank held by both processes (as with tensor parallelism): they agree.
    case("shared_rank", lambda: RankDataset(str(base / "meta_0.txt"), rank=0, world_size=1))

    # The ranks pass different world sizes.
    case("world_size_differs", lambda: RankDataset(str(base / "meta_0.txt"), rank=rank, world_size=2 + rank))

    # A mix of the same files and epoch size, with a different weight on each rank.
    def mix() -> None:
        sources = [Source(str(base / "meta_0.txt"), weight=1 + rank), Source(str(base / "meta_1.txt"), weight=1)]
        RankDataset(sources, reload_cfg={"epoch_size": 500})

    case("mix", mix)

    # Agreeing ranks build; then set_epoch with different epochs fails and leaves the dataset as it was.
    ds = RankDataset(str(base / "meta_0.txt"), reload_cfg={"mini_epoch": 2, "seed": 5})
    before = (ds.indices.tolist(), ds.spec)
    case("set_epoch", lambda: ds.set_epoch(1 + rank))
    results["set_epoch"]["unchanged"] = (ds.indices.tolist(), ds.spec) == before

    # load_state_dict: ranks loading different states disagree on the resume point.
    states = [ds.state_dict(consumed=3), ds.state_dict(consumed=7)]
    case("load_state_dict", lambda: ds.load_state_dict(states[rank]))
    results["load_state_dict"]["unchanged"] = (ds.indices.tolist(), ds.spec) == before

    # And agreeing ranks go on as before: set_epoch and load_state_dict of the same state.
    def agree() -> None:
        ds.set_epoch(1, 1)
        ds.load_state_dict(states[0])

    case("agree", agree)
    results["agree"]["world_size"] = ds.world_size

    write_rank_result(out, results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
