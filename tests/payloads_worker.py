"""Run by test_payloads.py as gloo ranks: payloads through the file reader, the collective reader and
StepSampler, each through 2 fork DataLoader workers; every item's bytes checked against its line."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import Payloads, RankDataset, StepSampler
from tests_helpers import write_rank_result


def payload(i: int) -> bytes:  # as test_payloads.payload
    seed = hashlib.blake2b(str(i).encode(), digest_size=32).digest()
    return (seed * 70)[: 64 + (i * 37) % 2048]


def checked(batches: list[list[Any]]) -> tuple[list[int], bool]:
    seen, ok = [], True
    for batch in batches:
        for meta, data in batch:
            i = int(meta[0].rsplit("_", 1)[1].split(".")[0])
            seen.append(i)
            ok = ok and data == payload(i)
    return seen, ok


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


def main(root: str, out: str) -> None:
    dist.init_process_group("gloo")
    result: dict[str, Any] = {}
    for reader in ("file", "collective"):
        ds = RankDataset(f"{root}/meta.txt", reload_cfg={"seed": 7}, parser="label", reader=reader,
                         payloads=Payloads(root, max_in_flight=8))  # fmt: skip
        loader = DataLoader(ds, batch_size=48, num_workers=2, collate_fn=as_list, multiprocessing_context="fork")
        seen, ok = checked(list(loader))
        result[reader] = {"seen": seen, "planned": ds.indices.tolist(), "ok": ok}
        ds.close()
    ds = RankDataset(f"{root}/meta.txt", reload_cfg={"seed": 7}, parser="label", payloads=Payloads(root))
    sampler = StepSampler(ds, 64)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=2, multiprocessing_context="fork")
    batches = [batch for _, batch in zip(range(10), loader)]
    seen, ok = checked(batches)
    plain = RankDataset(f"{root}/meta.txt", reload_cfg={"seed": 7}, parser="label")
    without = DataLoader(plain, batch_sampler=StepSampler(plain, 64), collate_fn=as_list)
    planned = [int(m[0].rsplit("_", 1)[1].split(".")[0]) for _, b in zip(range(10), without) for m in b]
    result["steps"] = {"seen": seen, "planned": planned, "ok": ok}
    write_rank_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
