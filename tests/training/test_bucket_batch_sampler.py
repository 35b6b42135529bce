"""BucketBatchSampler: batches of one bucket each over the epoch layout's shards, as many on every rank, fixed by
the plan, resumable; checked against a reference of per-bucket buffers, in a process and in a gloo job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from bucket_batches_worker import BATCH, BUCKETS, CFG, N
from rank_dataset import BucketBatchSampler, RankDataset, group_by
from tests_helpers import rank_results, run_ranks, worker_env


def number(line: str) -> int:
    return int(line.split()[0][4:-4])


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i}.jpg {BUCKETS[i]}\n" for i in range(N)))
    return path


def buffers(shard: list[int], buckets: np.ndarray, size: int) -> tuple[list[list[int]], list[list[int]]]:
    """The reference: walk the shard, each item into its bucket's buffer, a full buffer emitted (detectron2's
    AspectRatioGroupedDataset over one iterator); the full batches, and what is left in the buffers by bucket."""
    held: dict[int, list[int]] = {}
    full = []
    for i, sample in enumerate(shard):
        buf = held.setdefault(int(buckets[sample]), [])
        buf.append(i)
        if len(buf) == size:
            full.append(list(buf))
            buf.clear()
    return full, [held[b] for b in sorted(held) if held[b]]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("mini_epoch", [1, 3])
@pytest.mark.parametrize("drop_last", [True, False])
def test_batches_are_the_buffers_of_each_rank_and_as_many_on_every_rank(
    tmp_path: Path, world: int, mini_epoch: int, drop_last: bool
) -> None:
    rng = np.random.default_rng([world, mini_epoch, drop_last])
    n, size = int(rng.integers(40, 200)), int(rng.integers(1, 6))
    buckets = rng.integers(0, int(rng.integers(1, 6)), n) * 7  # ids need not be compact
    p = tmp_path / "m.txt"
    p.write_text("".join(f"img_{i}.jpg 0\n" for i in range(n)))
    for epoch in (0, 1):
        for m in range(mini_epoch):
            lengths, refs, got = [], [], []
            for r in range(world):
                ds = RankDataset(p, reload_cfg={"mini_epoch": mini_epoch, "seed": 9}, rank=r, world_size=world)
                ds.set_epoch(epoch, m)
                sampler = BucketBatchSampler(ds, size, bucket_by=buckets, drop_last=drop_last)
                batches = list(sampler)
                assert batches == list(sampler) and len(batches) == len(sampler)
                shard = ds.indices.tolist()
                for b in batches:
                    assert len({int(buckets[shard[i]]) for i in b}) == 1
                    assert len(b) == size or not drop_last
                lengths.append(len(batches))
                refs.append(buffers(shard, buckets, size))
                got.append(batches)
            assert len(set(lengths)) == 1  # the same number on every rank
            count = lengths[0]
            if drop_last:
                assert count == min(len(full) for full, _ in refs)
                assert all(g == full[:count] for g, (full, _) in zip(got, refs))
            else:
                assert count == max(len(full) + len(left) for full, left in refs)
                for g, (full, left) in zip(got, refs):
                    own = full + left
                    assert g == [own[i % len(own)] for i in range(count)]  # the rank's own, then repeated


def test_the_order_depends_on_the_epoch_and_a_grouping_dict_is_taken(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2)
    by_array = BucketBatchSampler(ds, BATCH, bucket_by=BUCKETS)
    by_dict = BucketBatchSampler(ds, BATCH, bucket_by=group_by(meta))  # the labels are the buckets
    first = list(by_array)
    assert first == list(by_dict)
    ds.set_epoch(1)
    assert list(by_array) != first


def test_resume_mid_shard_on_the_same_world_size_and_refused_on_another(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg=CFG, rank=1, world_size=2)
    ds.set_epoch(1, 1)
    sampler = BucketBatchSampler(ds, BATCH, bucket_by=BUCKETS)
    whole = list(sampler)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(sampler.state_dict()))
    assert head == whole[:4] and len(json.dumps(state)) < 1024
    again = RankDataset(meta, reload_cfg=CFG, rank=1, world_size=2)
    again.set_epoch(1, 1)
    resumed = BucketBatchSampler(again, BATCH, bucket_by=BUCKETS)
    resumed.load_state_dict(state)
    assert list(resumed) == whole[4:]
    assert list(resumed) == whole  # the next pass starts afresh
    other = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=3)
    other.set_epoch(1, 1)
    with pytest.raises(ValueError, match="taken on 2 ranks and this job has 3"):
        BucketBatchSampler(other, BATCH, bucket_by=BUCKETS).load_state_dict(state)
    with pytest.raises(ValueError, match="another epoch, mini-epoch or plan"):
        BucketBatchSampler(
            RankDataset(meta, reload_cfg=CFG, rank=1, world_size=2), BATCH, bucket_by=BUCKETS
        ).load_state_dict(state)


def test_arguments_are_checked(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=1)
    with pytest.raises(TypeError, match="must be a RankDataset"):
        BucketBatchSampler(list(range(N)), 2, bucket_by=BUCKETS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler(ds, 0, bucket_by=BUCKETS)
    with pytest.raises(ValueError, match="bucket_by must be a grouping dict or an int array"):
        BucketBatchSampler(ds, 2, bucket_by=BUCKETS[:-1])
    with pytest.raises(ValueError, match="not a mix nor exclude="):
        BucketBatchSampler(RankDataset(meta, exclude=[1], rank=0, world_size=1), 2, bucket_by=BUCKETS)
    with pytest.raises(ValueError, match="not a BucketBatchSampler state"):
        BucketBatchSampler(ds, 2, bucket_by=BUCKETS).load_state_dict({"consumed": 3})


def test_through_dataloader_workers(meta: Path) -> None:
    plan = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2)
    expected = [[int(plan.indices[i]) for i in b] for b in BucketBatchSampler(plan, BATCH, bucket_by=BUCKETS)]
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2)
    sampler = BucketBatchSampler(ds, BATCH, bucket_by=BUCKETS)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=2, multiprocessing_context="fork")
    assert [[number(x) for x in b] for b in loader] == expected
    (count,) = ds.audit()  # the pass audit counts what the sampler handed out, and the workers read it
    assert count.state == "finished" and count.drawn == count.read == BATCH * len(expected)


@pytest.mark.slow  # two 2-rank gloo jobs with workers
@pytest.mark.parametrize(("context", "drop_last"), [("fork", "1"), ("spawn", "0")])
def test_gloo_job_with_workers(meta: Path, tmp_path: Path, context: str, drop_last: str) -> None:
    out = tmp_path / "out"
    proc = run_ranks("bucket_batches_worker.py", 2, meta, context, out, drop_last, env=worker_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, 2)
    windows = [(e, m) for e in range(2) for m in range(2)]
    for w, (epoch, m) in enumerate(windows):
        assert len(results[0]["windows"][w]) == len(results[1]["windows"][w]) > 0
        for r in range(2):
            ds = RankDataset(meta, reload_cfg=CFG, rank=r, world_size=2)
            ds.set_epoch(epoch, m)
            expected = [
                [int(ds.indices[i]) for i in b]
                for b in BucketBatchSampler(ds, BATCH, bucket_by=BUCKETS, drop_last=drop_last == "1")
            ]
            got = [[number(x) for x in b] for b in results[r]["windows"][w]]
            assert got == expected
            assert all(len({int(BUCKETS[s]) for s in b}) == 1 for b in got)
