"""Cumulative bounds: each number's part and its number there, against a plain walk over the parts."""

from __future__ import annotations

import numpy as np
import pytest

from rank_dataset.plan.bounds import Bounds


def _walk(sizes: list[int], value: int) -> tuple[int, int]:
    for part, size in enumerate(sizes):
        if value < size:
            return part, value
        value -= size
    raise AssertionError("past the end")


@pytest.mark.parametrize("parts", [1, 2, 5, 16, 17, 40])  # comparisons up to 16 parts, a binary search past
def test_every_number_is_placed_in_its_part(parts: int) -> None:
    rng = np.random.default_rng(parts)
    for _ in range(20):
        sizes = rng.integers(0, 6, parts).tolist()
        sizes[int(rng.integers(parts))] += 1  # at least one number
        bounds = Bounds(sizes)
        assert bounds.total == sum(sizes) and bounds.starts.tolist() == np.cumsum([0, *sizes]).tolist()
        expect = [_walk(sizes, v) for v in range(bounds.total)]
        assert [bounds.locate(v) for v in range(bounds.total)] == expect
        values = np.arange(bounds.total)
        for dtype in (np.int8, np.int64):
            got = bounds.part_of(values, dtype)
            assert got.dtype == dtype and got.tolist() == [p for p, _ in expect]


def test_part_of_keeps_the_shape() -> None:
    assert Bounds([2, 3]).part_of([[0, 4], [1, 2]]).tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("seed", range(8))
def test_many_parts_are_looked_up_as_a_binary_search_finds_them(seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = int(rng.choice([17, 100, 1000, 5000]))
    kind = seed % 4
    if kind == 0:  # even
        sizes = np.full(parts, int(rng.integers(1, 50)))
    elif kind == 1:  # long-tailed: many parts far smaller than a bucket
        sizes = (1000 / np.arange(1, parts + 1) ** 1.5).astype(np.int64) + (np.arange(parts) % 3 == 0)
    elif kind == 2:  # with empty parts, first and last among them
        sizes = rng.integers(0, 4, parts) * rng.integers(0, 2, parts)
        sizes[[0, -1]] = 0
        sizes[parts // 2] += 1
    else:  # one huge part among tiny ones
        sizes = rng.integers(0, 3, parts)
        sizes[int(rng.integers(parts))] = 10**6
    bounds = Bounds(sizes.tolist())
    values = np.concatenate([rng.integers(0, bounds.total, 20_000), np.arange(min(bounds.total, 20_000))])
    values = np.concatenate([values, bounds.starts[:-1][sizes > 0], bounds.starts[1:][sizes > 0] - 1])
    expect = np.searchsorted(bounds.starts[1:-1], values, side="right")
    assert bounds.part_of(values).tolist() == expect.tolist()
    assert bounds.part_of(values, np.int16).tolist() == expect.tolist()
