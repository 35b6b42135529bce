"""StepSampler by shape (bucket_by, max_cost): one bucket a batch, within budget, the same on any world size,
through DataLoaders and resumes (ranks in one process)."""

from __future__ import annotations

import gc
import itertools
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, StepSampler, group_by
from rank_dataset.plan.shapes import ShapeLayout, ShapeStream, aspect_ratio_groups
from steps_shapes_worker import BUCKETS, CFG, COST, SHAPES, N
from tests_helpers import rank_results, run_ranks, spawn_workers, worker_env


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
    meta: Path,
    world: int,
    steps: int,
    start: int = 0,
    state: dict[str, Any] | None = None,
    workers: int = 0,
    context: str | None = None,
    **shape: Any,
) -> tuple[list[list[list[int]]], dict[str, Any]]:
    """Global batches ``start .. steps-1``, each as its ranks' sample numbers, and rank 0's state at the end
    (through DataLoaders of ``workers`` workers started by ``context``)."""
    per_rank, last = [], {}
    size = shape.pop("size", None)
    for r in range(world):
        ds = RankDataset(meta, reload_cfg=CFG, rank=r, world_size=world)
        sampler = StepSampler(ds, size, start_step=start, **shape)
        if state is not None:
            sampler.load_state_dict(state)
        dl = DataLoader(
            ds, batch_sampler=sampler, collate_fn=as_list, num_workers=workers, multiprocessing_context=context
        )
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
    first = flat([b[0] for b in ref[: plan.steps_before(1)]])
    assert len(first) == len(set(first))  # once an epoch; the run open at its end is the next epoch's first batch
    carried = set(range(N)) - set(first)
    assert carried and carried <= set(ref[plan.steps_before(1)][0]) and COST[sorted(carried)].sum() <= 30
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
    replacing = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2, on_error="replace")
    for kwargs in ({"bucket_by": BUCKETS}, {"max_cost": 50, "cost": COST}):
        with pytest.raises(ValueError, match="on_error='replace'"):
            StepSampler(replacing, None if "cost" in kwargs else 4, **kwargs)


def plan_of(kind: str) -> ShapeStream:
    shape = SHAPES[kind]
    return ShapeStream(
        N,
        CFG["seed"],
        shape.get("bucket_by"),
        batch_size=shape["size"],
        max_cost=shape.get("max_cost"),
        cost=shape.get("cost"),
    )


def plan_batches(plan: ShapeStream, steps: int, world: int) -> list[list[list[int]]]:
    """Global batches ``0 .. steps-1`` of ``plan``, each as its ranks' sample numbers by the plan."""
    layout = ShapeLayout(plan)
    out = []
    for t in range(steps):
        ranks = [layout.indices(plan.share(t, t + 1, world, r)[0], N, CFG["seed"], 0) for r in range(world)]
        out.append([r.tolist() for r in ranks])
    return out


def check_against_plan(kind: str, got: list[list[list[int]]], world: int) -> None:
    """Each global batch is the plan's, its ranks' blocks concatenated in rank order; every sample once an epoch."""
    plan = plan_of(kind)
    steps = len(got)
    whole = [flat(b) for b in plan_batches(plan, steps, 1)]
    assert [flat(ranks) for ranks in got] == [flat(b) for b in plan_batches(plan, steps, world)]
    for t, ranks in enumerate(got):
        assert all(ranks) and sorted(flat(ranks)) == sorted(whole[t]), t
        if kind == "bucket":
            assert flat(ranks) == whole[t] and len({int(BUCKETS[s]) for s in whole[t]}) == 1
        else:
            assert COST[whole[t]].sum() <= SHAPES[kind]["max_cost"]
    first = flat(whole[: plan.steps_before(1)])
    assert len(first) == len(set(first))  # no sample twice in an epoch
    missing = sorted(set(range(N)) - set(first))
    if kind == "budget":  # one bucket: its run open at the epoch's end is the next epoch's first batch
        assert missing and set(missing) <= set(whole[plan.steps_before(1)])
        assert COST[missing].sum() <= SHAPES[kind]["max_cost"]
    else:  # what is missing is each bucket's partial buffer, carried into the next epoch
        assert (np.bincount(BUCKETS[missing], minlength=3) < SHAPES[kind]["size"]).all()


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["bucket", "budget"])
def test_through_dataloader_workers(meta: Path, kind: str, context: str) -> None:
    shape = dict(SHAPES[kind])
    plan = plan_of(kind)
    steps = plan.steps_before(2) + 2  # two epochs and more: every window and epoch change crossed
    got, _ = run(meta, 2, steps, workers=spawn_workers(context), context=context, **shape)  # ranks 0, 1 in turn
    assert len(got) == steps
    check_against_plan(kind, got, 2)


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["bucket", "budget"])
def test_gloo_job_with_workers(meta: Path, tmp_path: Path, kind: str, context: str) -> None:
    steps = plan_of(kind).steps_before(2) + 2
    out = tmp_path / "out"
    proc = run_ranks("steps_shapes_worker.py", 2, kind, meta, context, out, steps, env=worker_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, 2)
    assert all(r["world_size"] == 2 and len(r["batches"]) == steps for r in results)
    got = [[[number(x) for x in r["batches"][t]] for r in results] for t in range(steps)]
    check_against_plan(kind, got, 2)


class OnePastTheShard:
    """A batch sampler over a StepSampler that hands out, at step ``bad``, an index past the rank's shard: the
    worker that reads it raises before it counts the batch."""

    def __init__(self, sampler: StepSampler, bad: int) -> None:
        self.sampler, self.bad = sampler, bad

    def __iter__(self) -> Iterator[list[int]]:
        for t, batch in enumerate(self.sampler):
            yield [10**6, *batch[1:]] if t == self.bad else batch


@pytest.mark.parametrize("kind", ["bucket", "budget"])
def test_a_worker_error_surfaces_at_once(meta: Path, kind: str) -> None:
    # The rank waits at a shard change until the old shard's batches are read: a batch a worker failed
    # before counting it must not hold it there (the DataLoader raises the worker's error, not a timeout).
    shape = dict(SHAPES[kind])
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=2)
    sampler = StepSampler(ds, shape.pop("size"), **shape)
    sampler._timeout = 300.0
    dl = DataLoader(ds, batch_sampler=OnePastTheShard(sampler, 1), collate_fn=as_list, num_workers=2)
    began = time.monotonic()
    batches = iter(dl)
    with pytest.raises(IndexError, match="dataset index"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in batches:
            pass
    assert time.monotonic() - began < 120
    del batches, dl
    gc.collect()  # the error's frames hold the DataLoader's iterator: its workers stop now
