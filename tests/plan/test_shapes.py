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
    """Greedy runs per bucket over the epochs' orders back to back, sample by sample: a run takes the next sample
    of its bucket while its cost stays within the budget. A run closed in the epoch of its last sample is emitted at
    that sample's draw; one carried from an earlier epoch, at the draw of the sample that does not fit it (before
    a run whose last sample is that one). The batches emitted in epochs ``[0, epochs)``."""
    out = []
    runs: dict[int, tuple[list[int], int, int]] = {}  # bucket -> (samples, cost, epoch of the last)
    last: dict[int, int] = {}
    for epoch in range(epochs):
        done: list[tuple[int, int, list[int]]] = []
        for d, s in enumerate(permute(n, SEED, epoch, np.arange(n)).tolist()):
            b = int(buckets[s])
            run, total, at = runs.get(b, ([], 0, epoch))
            if run and total + cost[s] > budget:
                done.append((last[b], 1, run) if at == epoch else (d, 0, run))
                run, total = [], 0
            runs[b] = ([*run, s], total + int(cost[s]), epoch)
            last[b] = d
        out += [run for _, _, run in sorted(done, key=lambda x: (x[0], x[1]))]
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


def check_once_in_the_stream(
    stream: ShapeStream, n: int, buckets: np.ndarray, cost: np.ndarray, budget: int, epochs: int
) -> None:
    """By budget, the batches of epochs ``[0, epochs)`` hold each draw of the stream once, but each bucket's
    open run at the end: its last draws in the stream, within the budget, which the next epoch's batches hold."""
    draws = np.concatenate([stream.table(e)[1] for e in range(epochs)])
    assert np.unique(draws).size == draws.size and draws.min() >= 0 and draws.max() < epochs * n
    missing = np.setdiff1d(np.arange(epochs * n), draws)
    samples = np.concatenate([permute(n, SEED, e, np.arange(n)) for e in range(epochs)])
    for b in range(int(buckets.max()) + 1):
        mine = np.flatnonzero(buckets[samples] == b)  # the bucket's draws in stream order
        left = missing[buckets[samples[missing]] == b]
        assert left.size > 0 and np.array_equal(left, mine[mine.size - left.size :]), b
        assert cost[samples[left]].sum() <= budget
        if 3 * cost[buckets == b].sum() > budget:  # the carried run cannot take 3 more epochs of its bucket
            later = np.concatenate([stream.table(e)[1] for e in range(epochs, epochs + 4)])
            assert np.isin(left, later).all(), b


@pytest.mark.parametrize("case", range(4))
def test_every_sample_once_an_epoch(case: int) -> None:
    n, buckets, cost = random_case(case)
    by_budget = ShapeStream(n, SEED, buckets, max_cost=150, cost=cost)
    check_once_in_the_stream(by_budget, n, buckets, cost, 150, 4)
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
    fresh.anchor(*stream.anchor_of(stream.steps_before(e)))  # a resume state's anchor: no replay
    assert fresh.anchor_of(t)[0] == e
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


@pytest.mark.parametrize("case", range(8))
def test_budget_runs_carry_across_epoch_ends_on_any_world_size(case: int) -> None:
    # Costs in [1, 10] and a budget of 80 or more: every run that closes holds more than 70, so 8 samples or
    # more, at an epoch's end too (its open runs carry on into the next epoch): no step is too short for W <= 8.
    rng = np.random.default_rng(100 + case)
    n = int(rng.integers(30, 200))
    buckets = rng.integers(0, int(rng.integers(1, 4)), n)
    cost = rng.integers(1, 11, n)
    budget = int(rng.integers(80, 200))
    epochs = 5
    expected = reference_by_budget(n, buckets, cost, budget, epochs)
    stream = ShapeStream(n, SEED, buckets, max_cost=budget, cost=cost)
    steps = stream.steps_before(epochs)
    assert len(expected) == steps and all(len(b) >= 8 for b in expected)
    check_once_in_the_stream(stream, n, buckets, cost, budget, epochs)
    for world in WORLDS:
        mini = int(rng.integers(1, 5))
        got = read(ShapeStream(n, SEED, buckets, max_cost=budget, cost=cost), world, mini, 0, steps)
        assert [sorted(flat(r)) for r in got] == [sorted(b) for b in expected], world
        assert all(all(r) for r in got)
        # a resume at a random step on another world size, from the state's anchor alone
        t = int(rng.integers(0, steps))
        done = ShapeStream(n, SEED, buckets, max_cost=budget, cost=cost)
        done.epoch_of(t)
        anchor = done.anchor_of(t)
        assert anchor is not None and len(repr(anchor)) < 200
        fresh = ShapeStream(n, SEED, buckets, max_cost=budget, cost=cost)
        fresh.anchor(*anchor)
        other = WORLDS[(WORLDS.index(world) + 1 + case) % len(WORLDS)]
        again = read(fresh, other, 1 + case % 3, t, steps - t)
        assert [sorted(flat(r)) for r in again] == [sorted(b) for b in expected[t:]], (world, other, t)


def test_an_anchor_is_checked() -> None:
    stream = ShapeStream(10, SEED, np.arange(10) % 2, max_cost=20, cost=np.full(10, 3))
    with pytest.raises(ValueError, match="carry must hold one count for each of the 2 buckets"):
        stream.anchor(1, 3, [1])
    with pytest.raises(ValueError, match="carry must hold one count"):
        stream.anchor(1, 3, [1, 6])  # more than the bucket's 5 samples before epoch 1
    with pytest.raises(ValueError, match="every sample of bucket 1 costs 0"):
        ShapeStream(4, SEED, np.array([0, 1, 0, 1]), max_cost=5, cost=np.array([1, 0, 1, 0]))


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
