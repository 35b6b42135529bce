from __future__ import annotations

import itertools

import numpy as np
import pytest

from rank_dataset.plan.permutation import permute
from rank_dataset.plan.spec import ShardSpec, eval_range, spread_positions

CASES = [(n, w, m) for n, w, m in itertools.product([1, 2, 3, 7, 10, 16, 17, 100, 1001], [1, 2, 3, 4, 8], [1, 2, 3, 5])]


def shards(n: int, w: int, m: int, seed: int = 5, epoch: int = 2) -> list[list[np.ndarray]]:
    return [
        [ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=i, seed=seed, epoch=epoch).indices() for r in range(w)]
        for i in range(m)
    ]


@pytest.mark.parametrize(("n", "w", "m"), CASES)
def test_train_layout_is_exactly_the_documented_one(n: int, w: int, m: int) -> None:
    r_ = -(-n // (w * m))
    t = r_ * w * m
    order = permute(n, 5, 2, np.arange(t) % n)  # P extended to T positions by wrapping
    for i, per_rank in enumerate(shards(n, w, m)):
        for r, got in enumerate(per_rank):
            expect = order[i * r_ * w + r + np.arange(r_) * w]
            assert np.array_equal(got, expect)


@pytest.mark.parametrize(("n", "w", "m"), CASES)
def test_every_rank_equal_and_every_sample_covered(n: int, w: int, m: int) -> None:
    all_idx = np.concatenate([np.concatenate(s) for s in shards(n, w, m)])
    r_ = -(-n // (w * m))
    assert all(len(x) == r_ for s in shards(n, w, m) for x in s)
    counts = np.bincount(all_idx, minlength=n)
    assert counts.min() >= 1  # every sample covered
    assert counts.sum() - n == r_ * w * m - n  # padding is exactly T - N
    # the padding repeats the start of the epoch order
    order = permute(n, 5, 2, np.arange(n))
    extra = np.repeat(np.arange(n), counts - 1)
    pad = r_ * w * m - n
    assert np.array_equal(np.sort(extra), np.sort(order[np.arange(pad) % n]))


def test_epoch_order_is_the_same_for_every_world_size() -> None:
    n = 1000
    orders = []
    for w in [1, 2, 4, 5, 8]:
        spec = [ShardSpec(n, w, r, seed=9, epoch=1).indices() for r in range(w)]
        r_ = len(spec[0])
        order = np.empty(r_ * w, np.int64)
        for r, got in enumerate(spec):
            order[r::w] = got
        orders.append(order[:n])
    for o in orders[1:]:
        assert np.array_equal(o, orders[0])


@pytest.mark.parametrize(("n", "w"), list(itertools.product([1, 2, 3, 7, 10, 101], [1, 2, 3, 4, 8, 16])))
def test_eval_layout(n: int, w: int) -> None:
    blocks = [ShardSpec(n, w, r, is_test=True, mini_epoch=3, seed=4).indices() for r in range(w)]
    assert np.array_equal(np.concatenate(blocks), np.arange(n))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert eval_range(n, w, 0)[0] == 0 and eval_range(n, w, w - 1)[1] == n


def test_spread_positions_wraps_within_the_range() -> None:
    assert spread_positions(10, 20, 4, 0).tolist() == [10, 14, 18]
    assert spread_positions(10, 20, 4, 3).tolist() == [13, 17, 11]
    with pytest.raises(ValueError, match="empty range"):
        spread_positions(5, 5, 2, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 0}, "num_samples must be >= 1, got 0"),
        ({"world_size": 0}, "world_size must be >= 1, got 0"),
        ({"rank": 4}, r"rank must be in \[0, world_size=4\), got 4"),
        ({"rank": -1}, r"rank must be in \[0, world_size=4\), got -1"),
        ({"mini_epoch": 0}, "mini_epoch must be >= 1, got 0"),
        ({"mini_epoch_idx": 2, "mini_epoch": 2}, r"mini_epoch_idx must be in \[0, mini_epoch=2\), got 2"),
        ({"epoch": -1}, "epoch must be >= 0, got -1"),
    ],
)
def test_spec_validation(kwargs: dict[str, int], message: str) -> None:
    base = {"num_samples": 10, "world_size": 4, "rank": 0}
    with pytest.raises(ValueError, match=message):
        ShardSpec(**{**base, **kwargs})


def test_spec_type_validation() -> None:
    with pytest.raises(TypeError, match="world_size must be an int"):
        ShardSpec(10, 2.0, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank must be an int"):
        ShardSpec(10, 2, True)
    with pytest.raises(TypeError, match="is_test must be a bool"):
        ShardSpec(10, 2, 0, is_test=1)  # type: ignore[arg-type]


def test_a_mix_keeps_the_layout_over_its_epoch_size() -> None:
    from rank_dataset.plan.mix import MixPlan

    mix = MixPlan((10, 4, 3), (9, 8, 2), 19)
    for w, m in [(1, 1), (2, 3), (4, 2)]:
        r_ = -(-19 // (w * m))
        for i in range(m):
            for r in range(w):
                spec = ShardSpec(19, w, r, mini_epoch=m, mini_epoch_idx=i, seed=3, epoch=1, mix=mix)
                positions = i * r_ * w + r + np.arange(r_) * w  # the plain layout over T0 positions
                assert np.array_equal(spec.positions(), positions)
                assert np.array_equal(spec.indices(), mix.epoch_order(3, 1, positions))
    every = MixPlan.every_sample((10, 4, 3))
    assert np.array_equal(ShardSpec(17, 2, 1, is_test=True, mix=every).indices(), np.arange(9, 17))
    with pytest.raises(ValueError, match="num_samples must be the mix's epoch size 19"):
        ShardSpec(17, 1, 0, mix=mix)
    with pytest.raises(ValueError, match="eval mix"):
        ShardSpec(19, 1, 0, is_test=True, mix=mix)
    with pytest.raises(TypeError, match="mix must be a MixPlan"):
        ShardSpec(19, 1, 0, mix=(10, 4, 3))  # type: ignore[arg-type]


# -- repeated augmentation (aug_repeats) -------------------------------------------------------------


def stream_reference(n: int, seed: int, stop: int) -> np.ndarray:
    """The first ``stop`` positions of a file's stream, O(stop): pass j is the (seed, j) permutation."""
    passes = -(-stop // n)
    return np.concatenate([permute(n, seed, j, np.arange(n)) for j in range(max(passes, 1))])[:stop]


def aug_order_reference(n: int, k: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch order of N positions with k copies a draw, from the stream: draws e*D..(e+1)*D-1."""
    d = -(-n // k)
    draws = stream_reference(n, seed, (epoch + 1) * d)[epoch * d :]
    return np.repeat(draws, k)[:n]


AUG_CASES = [(n, k, w, m) for n in [1, 2, 7, 10, 24, 101] for k in [1, 2, 3, 4] for w in [1, 2, 4, 6] for m in [1, 3]]


@pytest.mark.parametrize(("n", "k", "w", "m"), AUG_CASES)
def test_aug_repeats_layout_is_the_reference_over_the_plain_layout(n: int, k: int, w: int, m: int) -> None:
    for epoch in range(3):
        order = aug_order_reference(n, k, 5, epoch)
        r_ = -(-n // (w * m))
        for i in range(m):
            for r in range(w):
                spec = ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=i, seed=5, epoch=epoch, aug_repeats=k)
                positions = (i * r_ * w + r + np.arange(r_) * w) % n  # padding wraps, as without repeats
                assert np.array_equal(spec.indices(), order[positions])


def test_aug_repeats_1_is_the_plain_order() -> None:
    for n, w, m in [(10, 3, 2), (101, 4, 1), (1000, 8, 3)]:
        for epoch in range(3):
            for r in range(w):
                a = ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=m - 1, seed=2, epoch=epoch)
                b = ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=m - 1, seed=2, epoch=epoch, aug_repeats=1)
                assert np.array_equal(a.indices(), b.indices())
                assert np.array_equal(a.indices(), permute(n, 2, epoch, a.positions() % n))


@pytest.mark.parametrize(("n", "k", "w"), [(96, 2, 4), (96, 4, 8), (100, 2, 6), (1000, 3, 6), (120, 4, 4)])
def test_copies_sit_on_consecutive_ranks_at_one_shard_position(n: int, k: int, w: int) -> None:
    for m in (1, 2):
        for i in range(m):
            shards = np.stack(
                [ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=i, seed=1, aug_repeats=k).indices() for r in range(w)]
            )
            positions = np.stack([ShardSpec(n, w, r, mini_epoch=m, mini_epoch_idx=i).positions() for r in range(w)])
            real = positions < (n // k) * k  # neither the cut-short last draw nor the padding
            groups = shards.reshape(w // k, k, -1)  # ranks r..r+k-1 of a group, at each shard position
            held = real.reshape(w // k, k, -1).all(axis=1)
            assert held.any()
            same = (groups == groups[:, :1]).all(axis=1)
            assert same[held].all()  # the k copies of a draw: same sample, k distinct ranks, one position
            # and two groups of one step hold distinct draws
            for j in np.flatnonzero(held.all(axis=0)):
                assert len(set(groups[:, 0, j].tolist())) == w // k


@pytest.mark.parametrize(("n", "k"), [(10, 2), (12, 3), (100, 4), (101, 2), (7, 3), (1000, 7)])
def test_k_consecutive_epochs_draw_every_sample_once(n: int, k: int) -> None:
    d = -(-n // k)
    drawn = np.concatenate([ShardSpec(n, 1, 0, seed=3, epoch=e, aug_repeats=k).indices()[::k] for e in range(2 * k)])
    assert len(drawn) == 2 * k * d
    for start in (0, k * d):  # each group of k epochs, from epoch 0 and from epoch k
        seen = np.bincount(drawn[start : start + k * d], minlength=n)
        if n % k == 0:
            assert (seen == 1).all()
        # cumulative bound: after E epochs each sample drawn floor or ceil of E * D / N times
    cumulative = np.bincount(drawn, minlength=n)
    assert cumulative.min() == (2 * k * d) // n and cumulative.max() == -(-(2 * k * d) // n)
    # within the first pass, no sample is drawn twice
    assert len(set(drawn[:n].tolist())) == n


def test_aug_repeats_order_does_not_depend_on_the_world_size() -> None:
    n, k = 1000, 2
    orders = []
    for w in [1, 2, 3, 4, 8]:
        shards = [ShardSpec(n, w, r, seed=9, epoch=1, aug_repeats=k).indices() for r in range(w)]
        order = np.empty(len(shards[0]) * w, np.int64)
        for r, got in enumerate(shards):
            order[r::w] = got
        orders.append(order[:n])
    for o in orders[1:]:
        assert np.array_equal(o, orders[0])


def test_aug_repeats_validation() -> None:
    with pytest.raises(ValueError, match="aug_repeats must be >= 1, got 0"):
        ShardSpec(10, 2, 0, aug_repeats=0)
    with pytest.raises(ValueError, match="aug_repeats must be >= 1, got -2"):
        ShardSpec(10, 2, 0, aug_repeats=-2)
    with pytest.raises(TypeError, match="aug_repeats must be an int"):
        ShardSpec(10, 2, 0, aug_repeats=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"aug_repeats=2 .*eval mode"):
        ShardSpec(10, 2, 0, is_test=True, aug_repeats=2)
    assert ShardSpec(10, 2, 0, is_test=True, aug_repeats=1).indices().tolist() == [0, 1, 2, 3, 4]


def test_aug_repeats_in_a_mix_draws_the_mixed_order() -> None:
    from rank_dataset.plan.mix import MixPlan

    mix = MixPlan((10, 4, 3), (9, 8, 2), 19)
    for k, w in [(1, 2), (2, 2), (2, 4), (3, 3)]:
        for r in range(w):
            spec = ShardSpec(19, w, r, seed=3, epoch=2, mix=mix, aug_repeats=k)
            assert np.array_equal(spec.indices(), mix.epoch_order(3, 2, spec.positions(), k))
    with pytest.raises(ValueError, match="too few for one draw of aug_repeats=10"):
        ShardSpec(19, 1, 0, mix=mix, aug_repeats=10)
