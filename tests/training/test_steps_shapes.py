"""StepSampler by shape (bucket_by, max_cost): one bucket a batch, within budget, the same on any world size,
through DataLoaders and resumes (ranks in one process)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, StepSampler, group_by
from rank_dataset.plan.shapes import ShapeStream, aspect_ratio_groups

N = 61
CFG = {"mini_epoch": 3, "seed": 5}
BUCKETS = np.arange(N) % 3
COST = (np.arange(N) * 7) % 10 + 1


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


def number(line: str) -> int:
    return int(line.split()[0][4:-4])


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i}.jpg {i % 3}\n" for i in range(N)))
    return path


def run(
    meta: Path, world: int, steps: int, start: int = 0, state: dict[str, Any] | None = None, **shape: Any
) -> tuple[list[list[list[int]]], dict[str, Any]]:
    """Global batches ``start .. steps-1``, each as its ranks' sample numbers, and rank 0's state at the end."""
    per_rank, last = [], {}
    size = shape.pop("size", None)
    for r in range(world):
        ds = RankDataset(meta, reload_cfg=CFG, rank=r, world_size=world)
        sampler = StepSampler(ds, size, start_step=start, **shape)
        if state is not None:
            sampler.load_state_dict(state)
        dl = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=0)
        per_rank.append([[number(x) for x in b] for _, b in zip(range(start, steps), dl)])
        if r == 0:
            last = sampler.state_dict(step=steps)
        del dl
    return [[per_rank[r][t] for r in range(world)] for t in range(steps - start)], last


def flat(ranks: list[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(ranks))


def test_buckets_on_any_world_size_and_resume(meta: Path) -> None:
    steps = 3 * N // 6
    ref, _ = run(meta, 1, steps, size=6, bucket_by=BUCKETS)
    plan = ShapeStream(N, 5, BUCKETS, batch_size=6)
    for t, (batch,) in enumerate(ref):
        assert len({int(BUCKETS[s]) for s in batch}) == 1
        e = plan.epoch_of(t)
        _, members, offsets = plan.table(e)
        k = t - plan.steps_before(e)
        assert len(batch) == 6 and len(members[offsets[k] : offsets[k + 1]]) == 6
    groups = group_by(meta)  # the grouping dict of the labels: the same buckets
    for world in (2, 3):
        got, state = run(meta, world, steps, size=6, bucket_by=groups)
        assert [flat(r) for r in got] == [r[0] for r in ref]
    assert len(json.dumps(state)) < 1024
    _, state = run(meta, 2, 9, size=6, bucket_by=BUCKETS)
    rest, _ = run(meta, 3, steps, start=0, state=state, size=6, bucket_by=BUCKETS)
    assert [flat(r) for r in rest[: steps - 9]] == [r[0] for r in ref[9:]]


def test_budget_on_any_world_size_and_resume(meta: Path) -> None:
    shape = {"max_cost": 30, "cost": COST}
    plan = ShapeStream(N, 5, None, max_cost=30, cost=COST)
    steps = plan.steps_before(2)
    ref, _ = run(meta, 1, steps, **shape)
    assert sorted(flat([b[0] for b in ref[: plan.steps_before(1)]])) == list(range(N))  # once an epoch
    for batch in ref:
        assert COST[batch[0]].sum() <= 30
    got, state = run(meta, 2, steps, **shape)
    for t, ranks in enumerate(got):
        assert all(ranks) and sorted(flat(ranks)) == sorted(ref[t][0])
    assert "anchor" in state and len(json.dumps(state)) < 1024
    mid = steps // 2
    _, state = run(meta, 2, mid, **shape)
    rest, _ = run(meta, 1, steps, state=state, **shape)
    assert [sorted(flat(r)) for r in rest[: steps - mid]] == [sorted(b[0]) for b in ref[mid:]]


def test_refusals(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2)
    with pytest.raises(ValueError, match="sample 3 costs 99"):
        StepSampler(ds, None, max_cost=50, cost=np.where(np.arange(N) == 3, 99, 1))
    with pytest.raises(ValueError, match="global_batch_size must be None"):
        StepSampler(ds, 4, max_cost=50, cost=COST)
    with pytest.raises(ValueError, match="one global_batch_size"):
        StepSampler(ds, {0: 4, 3: 8}, bucket_by=BUCKETS)
    with pytest.raises(ValueError, match="not a multiple of the world size 2"):
        StepSampler(ds, 5, bucket_by=BUCKETS)
    plain = StepSampler(ds, 4)
    bucketed = StepSampler(ds, 4, bucket_by=BUCKETS)
    with pytest.raises(ValueError, match="another batches by shape"):
        plain.load_state_dict(bucketed.state_dict())
    with pytest.raises(ValueError, match="another batches by shape"):
        wide = aspect_ratio_groups(BUCKETS + 1, np.full(N, 2))
        bucketed.load_state_dict(StepSampler(ds, 4, bucket_by=wide).state_dict())
    assert "shapes" not in plain.state_dict()
