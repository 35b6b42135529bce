"""Cumulative bounds: each number's part and its number there, against a plain walk over the parts."""

from __future__ import annotations

import numpy as np
import pytest

from rank_dataset._bounds import Bounds


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
