"""Batches by shape (rank_dataset.plan.shapes): property tests against a per-sample reference walk."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rank_dataset.plan.permutation import permute
from rank_dataset.plan.shapes import (
    SDXL_RESOLUTIONS,
    ShapeLayout,
    ShapeStream,
    aspect_ratio_groups,
    bucket_ids,
    nearest_resolution,
    split_by_cost,
)
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.steps import StepLayout

SEED = 11
WORLDS = (1, 2, 3, 4, 8)


def reference_by_count(n: int, buckets: np.ndarray, size: int, steps: int) -> list[list[int]]:
    """detectron2's buffers with one global buffer per bucket, walked sample by sample over the epochs."""
    out: list[list[int]] = []
    buffers: dict[int, list[int]] = {}
    epoch = 0
    while len(out) < steps:
        for s in permute(n, SEED, epoch, np.arange(n)).tolist():
            buf = buffers.setdefault(int(buckets[s]), [])
            buf.append(s)
            if len(buf) == size:
                out.append(buf[:])
                buf.clear()
        epoch += 1
    return out[:steps]


def reference_by_budget(n: int, buckets: np.ndarray, cost: np.ndarray, budget: int, epochs: int) -> list[list[int]]:
    """Greedy runs per epoch and bucket, in order of their last draw."""
    out = []
    for epoch in range(epochs):
        order = permute(n, SEED, epoch, np.arange(n)).tolist()
        runs: dict[int, tuple[list[int], int]] = {}
        done: list[tuple[int, list[int]]] = []
        last: dict[int, int] = {}
        for d, s in enumerate(order):
            b = int(buckets[s])
            run, total = runs.get(b, ([], 0))
            if run and total + cost[s] > budget:
                done.append((last[b], run))
                run, total = [], 0
            runs[b] = ([*run, s], total + int(cost[s]))
            last[b] = d
        done += [(last[b], run) for b, (run, _) in runs.items() if run]
        out += [run for _, run in sorted(done, key=lambda x: x[0])]
    return out


def flat(ranks: list[list[int]]) -> list[int]:
    """A step's samples, its ranks' in rank order."""
    return list(itertools.chain.from_iterable(ranks))


def read(stream: ShapeStream, world: int, mini: int, start: int, steps: int) -> list[list[list[int]]]:
    """Steps ``[start, start + steps)``, each as its ranks' samples, read window by window as a sampler does."""
    layout = ShapeLayout(stream)
    n = stream.num_samples
    out: list[list[list[int]]] = []
    step = start
    while len(out) < steps:
        epoch, m = layout.window_of(step, n, mini)
        first, stop = layout.steps_of(n, mini, epoch, m)
        ranks = []
        for r in range(world):
            pos = layout.positions(n, world, r, mini, epoch, m)
            samples = layout.indices(pos, n, SEED, epoch).tolist()
            counts = np.cumsum(np.concatenate(([0], layout.counts(world, r, first, stop)))).tolist()
            ranks.append([samples[a:b] for a, b in itertools.pairwise(counts)])
        for u in range(step - first, stop - first):
            out.append([ranks[r][u] for r in range(world)])
        step = stop
    return out[:steps]


def random_case(seed: int) -> tuple[int, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 300))
    k = int(rng.integers(1, 6))
    buckets = rng.integers(0, k, n)
    cost = rng.integers(1, 50, n)
    return n, buckets, cost


@pytest.mark.parametrize("case", range(6))
def test_by_count_matches_the_buffers_on_any_world_size(case: int) -> None:
    n, buckets, _ = random_case(case)
    size = 24  # every W of WORLDS divides it
    steps = 3 * n // size
    expected = reference_by_count(n, buckets, size, steps)
    for world in WORLDS:
        mini = 1 + (case + world) % 4
        got = read(ShapeStream(n, SEED, buckets, batch_size=size), world, mini, 0, steps)
        assert [flat(ranks) for ranks in got] == expected, (world, mini)
    for batch in expected:
        assert len({int(buckets[s]) for s in batch}) == 1


@pytest.mark.parametrize("case", range(6))
def test_by_budget_matches_the_greedy_runs_and_splits_among_ranks(case: int) -> None:
    n, buckets, cost = random_case(case)
    budget = 200
    expected = reference_by_budget(n, buckets, cost, budget, 3)
    for world in WORLDS:
        stream = ShapeStream(n, SEED, buckets, max_cost=budget, cost=cost)
        mini = 1 + case % 3
        short = [t for t, b in enumerate(expected) if len(b) < world]
        steps = len(expected)
        if short:  # the shards up to the window of the first step too short for the ranks
            layout = ShapeLayout(stream)
            steps = layout.steps_of(n, mini, *layout.window_of(short[0], n, mini))[0]
        got = read(stream, world, mini, 0, steps)
        for t, ranks in enumerate(got):
            assert all(ranks), (world, t)  # every rank has a sample
            assert sorted(flat(ranks)) == sorted(expected[t])
            if world == 1:
                assert ranks[0] == expected[t]
            assert cost[flat(ranks)].sum() <= budget
            assert len({int(buckets[s]) for s in flat(ranks)}) == 1
        if short:  # the step whose run is too short for the ranks is named
            with pytest.raises(ValueError, match=f"global batch {short[0]} holds"):
                read(stream, world, mini, short[0], 1)


@pytest.mark.parametrize("case", range(4))
def test_every_sample_once_an_epoch(case: int) -> None:
    n, buckets, cost = random_case(case)
    by_budget = ShapeStream(n, SEED, buckets, max_cost=150, cost=cost)
    for e in range(3):  # by budget: an epoch's batches are its draws, each once
        members = by_budget.table(e)[1]
        assert sorted(members.tolist()) == list(range(e * n, (e + 1) * n))
    by_count = ShapeStream(n, SEED, buckets, batch_size=8)
    draws = np.concatenate([by_count.table(e)[1] for e in range(4)])
    assert np.unique(draws).size == draws.size
    carried = (4 * np.bincount(buckets)) % 8  # what each bucket's buffer holds after 4 epochs
    assert draws.size == 4 * n - carried.sum() and draws.min() >= 0 and draws.max() < 4 * n
    missing = np.setdiff1d(np.arange(4 * n), draws)  # the carried: each bucket's last draws of the stream
    samples = permute(n, SEED, 3, np.arange(n))
    for b, c in enumerate(carried.tolist()):
        mine = np.flatnonzero(buckets[samples] == b)  # only if the bucket has c samples in the last epoch
        if c <= mine.size:
            assert np.isin(3 * n + mine[mine.size - c :], missing).all()


@pytest.mark.parametrize("case", range(6))
def test_resume_at_a_random_step_on_another_world_size(case: int) -> None:
    n, buckets, cost = random_case(case + 20)
    rng = np.random.default_rng(case)
    count = read(ShapeStream(n, SEED, buckets, batch_size=24), 1, 3, 0, 2 * n // 24)
    t = int(rng.integers(0, len(count)))
    w = int(rng.choice([2, 3, 4, 8]))
    again = read(ShapeStream(n, SEED, buckets, batch_size=24), w, 2, t, len(count) - t)
    assert [flat(r) for r in again] == [flat(r) for r in count[t:]]
    stream = ShapeStream(n, SEED, buckets, max_cost=400, cost=cost)
    full = read(stream, 1, 2, 0, stream.steps_before(3))
    t = int(rng.integers(0, len(full)))
    fresh = ShapeStream(n, SEED, buckets, max_cost=400, cost=cost)
    e = stream.epoch_of(t)
    fresh.anchor(e, stream.steps_before(e))  # a resume state's anchor: no replay
    assert fresh.epoch_of(t) == e and fresh.steps_before(e + 1) == stream.steps_before(e + 1)
    again = read(fresh, 1, 3, t, len(full) - t)
    assert again == full[t:]
    # On another world size (replayed from step 0), one bucket: the same samples each step, every rank some.
    one = read(ShapeStream(n, SEED, None, max_cost=400, cost=cost), 1, 1, 0, len(full))
    w = int(rng.choice([2, 3]))
    if min(len(b[0]) for b in one) >= w:
        ranks = read(ShapeStream(n, SEED, None, max_cost=400, cost=cost), w, 1, t, len(one) - t)
        assert [sorted(flat(r)) for r in ranks] == [sorted(b[0]) for b in one[t:]]
        assert all(all(r) for r in ranks)


def test_greedy_split_beats_equal_counts() -> None:
    rng = np.random.default_rng(3)
    for world in (2, 3, 4, 8):
        greedy, equal = [], []
        for _ in range(200):
            length = int(rng.integers(world, 12 * world))
            cost = rng.lognormal(10, 1, length).astype(np.int64) + 1
            ranks = split_by_cost(cost, [0, length], world)
            assert set(ranks.tolist()) == set(range(world))
            totals = np.bincount(ranks, weights=cost, minlength=world)
            greedy.append(totals.max() / totals.mean())
            blocks = [c.sum() for c in np.array_split(cost, world)]
            equal.append(max(blocks) / np.mean(blocks))
        assert np.mean(greedy) <= np.mean(equal), world


def test_split_is_a_function_of_the_batch_and_world_size() -> None:
    cost = np.array([5, 1, 9, 3, 3, 7, 2])
    a = split_by_cost(np.concatenate([cost, cost]), [0, 7, 14], 3)
    assert a[:7].tolist() == a[7:].tolist() == split_by_cost(cost, [0, 7], 3).tolist()
    with pytest.raises(ValueError, match="cannot be split among 8 ranks"):
        split_by_cost(cost, [0, 7], 8)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="sample 2 costs 99, more than max_cost=50"):
        ShapeStream(4, 0, None, max_cost=50, cost=np.array([1, 2, 99, 3]))
    with pytest.raises(ValueError, match="not both nor neither"):
        ShapeStream(4, 0, None)
    with pytest.raises(ValueError, match="integer array"):
        ShapeStream(4, 0, None, max_cost=5, cost=np.ones(4))
    with pytest.raises(ValueError, match="aug_repeats"):
        ShapeStream(4, 0, None, batch_size=2).check(2, 2)
    with pytest.raises(ValueError, match="not a multiple of the world size 3"):
        ShapeStream(4, 0, None, batch_size=2).check(3)


def test_bucket_helpers() -> None:
    w, h = np.array([640, 480, 500, 1920]), np.array([480, 640, 500, 1080])
    assert aspect_ratio_groups(w, h).tolist() == [0, 1, 1, 0]
    assert aspect_ratio_groups(w, h, [0.9, 1.1]).tolist() == [2, 0, 1, 2]
    res = nearest_resolution(w, h)
    assert SDXL_RESOLUTIONS[res[2]] == (1024, 1024)
    assert SDXL_RESOLUTIONS[res[3]][0] > SDXL_RESOLUTIONS[res[3]][1]
    with pytest.raises(ValueError, match="sample 1 has no positive size"):
        aspect_ratio_groups([1, 0], [1, 1])
    assert bucket_ids({"a": [1], "b": [0, 2]}, 3).tolist() == [1, 0, 1]
    assert bucket_ids(np.array([5, -1, 5]), 3).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="sample 2 is in no group"):
        bucket_ids({"a": [0, 1]}, 3)
    with pytest.raises(ValueError, match="int array"):
        bucket_ids(np.ones(3), 3)


def test_layout_in_a_shard_spec() -> None:
    n, buckets, _ = random_case(1)
    layout = ShapeLayout(ShapeStream(n, SEED, buckets, batch_size=8))
    spec = ShardSpec(n, world_size=2, rank=1, seed=SEED, mini_epoch=2, steps=layout)
    first, stop = layout.steps_of(n, 2, 0, 0)
    assert spec.indices().size == (stop - first) * 4
    assert layout == ShapeLayout(ShapeStream(n, SEED, buckets, batch_size=8))
    assert layout != ShapeLayout(ShapeStream(n, SEED, buckets, batch_size=16))
    back = ShardSpec.from_dict(spec.to_dict())  # what a worker reads: the digest, no positions
    assert isinstance(back.steps, StepLayout) and back.steps.shapes == layout.shapes
    with pytest.raises(ValueError, match="batches by shape"):
        back.indices()
    with pytest.raises(ValueError, match="not a multiple of the world size 3"):
        ShardSpec(n, world_size=3, rank=0, seed=SEED, steps=layout)
