from __future__ import annotations

import math

import numpy as np
import pytest

from rank_dataset.plan.balance import FACTOR_GRID, class_weights, factor_groups, lvis_factors, round_factors


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0, 2.0, -1.0])
def test_class_weights_are_counts_to_the_power(power: float) -> None:
    counts = np.array([1, 7, 100, 3000])
    got = class_weights(counts, power)
    want = [c**power for c in counts.tolist()]
    assert np.allclose(got / got.sum(), np.array(want) / sum(want)) and got.max() == 1.0


def test_class_weights_do_not_overflow() -> None:
    assert np.isfinite(class_weights([1, 10**9], 40.0)).all()


@pytest.mark.parametrize("counts", [[], [0, 1], [[1]], [1.5]])
def test_class_weights_reject_bad_counts(counts: list) -> None:
    with pytest.raises(ValueError):
        class_weights(np.array(counts), 1.0)


def test_factors_round_to_the_grid() -> None:
    rng = np.random.default_rng(0)
    r = np.concatenate([rng.uniform(0.001, 20, 10_000), np.arange(1, 10)])
    got = round_factors(r)
    assert (got * FACTOR_GRID == np.round(got * FACTOR_GRID)).all() and got.min() >= 1 / FACTOR_GRID
    assert (np.abs(got - r) <= 0.5 / FACTOR_GRID + 1e-12)[r >= 1 / FACTOR_GRID].all()
    assert got[-9:].tolist() == list(range(1, 10))  # integers stay integers


@pytest.mark.parametrize("bad", [[0.0], [-1.0], [math.inf], [math.nan], [[1.0]], ["a"]])
def test_factors_must_be_positive_and_finite(bad: list) -> None:
    with pytest.raises(ValueError):
        round_factors(np.array(bad))


def test_factor_groups_partition_the_samples() -> None:
    rng = np.random.default_rng(1)
    r = rng.choice([1.0, 1.5, 2.0, 3.3, 0.5], 5000)
    groups = factor_groups(r)
    assert list(groups) == sorted(groups)
    assert np.array_equal(np.sort(np.concatenate(list(groups.values()))), np.arange(r.size))
    rounded = round_factors(r)
    for factor, ids in groups.items():
        assert (np.diff(ids) > 0).all() and (rounded[ids] == factor).all()


def test_lvis_factors_follow_the_rule() -> None:
    rng = np.random.default_rng(2)
    cats = [list(rng.choice(30, rng.integers(0, 4)) ** 2 % 29) for _ in range(2000)]  # skewed, with repeats
    t = 0.05
    n = len(cats)
    freq = {c: sum(c in set(cs) for cs in cats) / n for c in {c for cs in cats for c in cs}}
    want = [max([1.0] + [max(1.0, math.sqrt(t / freq[c])) for c in cs]) for cs in cats]
    assert np.allclose(lvis_factors(cats, t), want)


@pytest.mark.parametrize("t", [0, 1.5, -0.1])
def test_lvis_threshold_is_checked(t: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        lvis_factors([[1]], t)
