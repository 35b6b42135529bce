"""Cumulative bounds: which part (file, source) a global number falls in, and its number there.

Parts of ``sizes[i]`` numbers each, laid end to end: part ``i`` holds ``[starts[i], starts[i+1])``.
Empty parts hold nothing, so a number is never placed in one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums

__all__ = ["Bounds"]

_FEW = 16  # up to this many parts, find a number's part by comparisons, not a binary search
_BUCKETS = 4  # buckets a part in the lookup table of many parts
_STEPS = 4  # parts a lookup steps over before it leaves a number to a binary search


class Bounds:
    """The cumulative bounds of parts of ``sizes`` numbers each.

    Examples:
        >>> b = Bounds([2, 0, 3])
        >>> b.starts.tolist(), b.total, b.locate(2), b.part_of([0, 1, 2, 4]).tolist()
        ([0, 2, 2, 5], 5, (2, 0), [0, 0, 2, 2])
    """

    def __init__(self, sizes: Sequence[int] | npt.NDArray[np.int64]) -> None:
        self.starts = prefix_sums(sizes)
        self._inner = self.starts[1:-1]
        self._few = self._inner.tolist() if self._inner.size <= _FEW else None
        self._table: tuple[int, npt.NDArray[np.int64]] | None = None
        self._starts: list[int] = self.starts.tolist()  # for locating one number (bisect on a list: no numpy call)

    @property
    def total(self) -> int:
        """The numbers of all parts together."""
        return self._starts[-1]

    def part_of(self, values: npt.ArrayLike, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[Any]:
        """The part of each number in ``values`` (in ``[0, total)``), as ``dtype``."""
        v = np.asarray(values, np.int64)
        if self._few is not None:
            out = np.zeros(v.shape, dtype)
            for bound in self._few:
                out += v >= bound
            return out
        if v.size < 4 * self._inner.size or int(v.min()) < 0 or int(v.max()) >= self.total:
            return np.searchsorted(self._inner, v, side="right").astype(dtype, copy=False)
        return self._looked_up(v).astype(dtype, copy=False)

    def _looked_up(self, v: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`part_of` of numbers in ``[0, total)`` through a table of the part at the start of every
        bucket of ``2**shift`` numbers, then a step to the next part where a part starts inside the
        bucket at or below the number: O(1) a number."""
        if self._table is None:
            shift = (self.total // (_BUCKETS * (self._inner.size + 1))).bit_length()
            firsts = np.arange(((self.total - 1) >> shift) + 1, dtype=np.int64) << shift
            self._table = shift, np.searchsorted(self._inner, firsts, side="right")
        shift, table = self._table
        part: npt.NDArray[np.int64] = table[v >> shift]
        ends = self.starts[1:]
        rows = np.flatnonzero(ends[part] <= v)
        for _ in range(_STEPS):
            if not rows.size:
                return part
            part[rows] += 1
            rows = rows[ends[part[rows]] <= v[rows]]
        if rows.size:  # many parts start in one bucket (parts far smaller than the rest)
            part[rows] = np.searchsorted(self._inner, v[rows], side="right")
        return part

    def locate(self, value: int) -> tuple[int, int]:
        """``(part, number within that part)`` of one number in ``[0, total)``."""
        part = bisect.bisect_right(self._starts, value, 1, len(self._starts) - 1) - 1
        return part, value - self._starts[part]
