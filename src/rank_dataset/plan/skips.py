"""Skipped step ranges: data batches a run by steps does not train on (after a loss spike, say).

The step stream's global batches (:mod:`rank_dataset.plan.steps`) are the *data batches* ``0, 1, 2, ...``: batch
``d`` is a pure function of the files and the settings, and the batch-size and mixture schedules are keyed by
``d``. A training loop counts *loop steps* (optimizer steps). Skips are half-open ranges ``[a, b)`` of data
batches that no loop step receives: the loop step that would have received batch ``a`` receives batch ``b``, and
every later loop step is shifted by ``b - a``. So the schedules follow the data (a skip of 100 batches moves a
ramp-up 100 batches on, as the data position does), the optimizer's step count runs on unbroken, and a batch's
samples never depend on the skips: only which loop step receives it does.

Ranges are kept sorted. The same range given twice counts once; two different ranges that overlap are refused.

Example:
    >>> s = Skips.of([(3, 5)])
    >>> [s.batch_of(t) for t in range(6)], s.skipped(4), s.skipped(5)
    ([0, 1, 2, 5, 6, 7], True, False)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import MAX_EXACT, check_int

__all__ = ["Skips"]


@dataclass(frozen=True)
class Skips:
    """Sorted, non-overlapping half-open ranges ``[a, b)`` of data batches not trained on (see the module)."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, value: Any, name: str = "skip") -> Skips:
        """Skips from a list of ``(a, b)`` pairs (or Skips, or None: none), merged as :meth:`merge` does.

        Raises:
            TypeError: not a list of pairs of ints (naming ``name``).
            ValueError: ``a >= b``, a negative batch, or two different ranges that overlap (naming both).
        """
        if value is None:
            return cls()
        if isinstance(value, Skips):
            return value
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise TypeError(f"{name} must be a list of (first, stop) pairs of data batches, got {value!r}")
        out = cls()
        for i, pair in enumerate(value):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable):
                raise TypeError(f"{name}[{i}] must be a (first, stop) pair of data batches, got {pair!r}")
            items = tuple(pair)
            if len(items) != 2:
                raise TypeError(f"{name}[{i}] must be a (first, stop) pair of data batches, got {pair!r}")
            a = check_int(f"{name}[{i}] first", items[0], low=0, high=MAX_EXACT)
            b = check_int(f"{name}[{i}] stop", items[1], low=0, high=MAX_EXACT)
            if a >= b:
                raise ValueError(f"{name}[{i}] = [{a}, {b}) is empty: a range of data batches needs first < stop")
            out = out.add(a, b)
        return out

    def add(self, a: int, b: int) -> Skips:
        """These skips and ``[a, b)``: itself if it holds that range already.

        Raises:
            ValueError: ``[a, b)`` overlaps a different range held (naming it).
        """
        if (a, b) in self.ranges:
            return self
        for c, d in self.ranges:
            if a < d and c < b:
                raise ValueError(
                    f"the skipped range [{a}, {b}) overlaps the skipped range [{c}, {d}): give ranges of data "
                    "batches that are disjoint (or the same range again, which counts once)"
                )
        return Skips(tuple(sorted((*self.ranges, (a, b)))))

    def merge(self, other: Skips) -> Skips:
        """The ranges of both (the same range in both counts once); ValueError as :meth:`add`."""
        out = self
        for a, b in other.ranges:
            out = out.add(a, b)
        return out

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def to_list(self) -> list[list[int]]:
        """``[[a, b], ...]``: JSON-safe, read back by :meth:`of`."""
        return [[a, b] for a, b in self.ranges]

    def batch_of(self, step: int) -> int:
        """The data batch that loop step ``step`` receives."""
        d = step
        for a, b in self.ranges:
            if a > d:
                break
            d += b - a
        return d

    def trained(self, stop: int) -> list[tuple[int, int]]:
        """The half-open ranges of data batches before ``stop`` that are trained on (not skipped), ascending.

        Example:
            >>> Skips.of([(3, 5), (7, 8)]).trained(10)
            [(0, 3), (5, 7), (8, 10)]
        """
        out, start = [], 0
        for a, b in self.ranges:
            if a >= stop:
                break
            if start < a:
                out.append((start, a))
            start = b
        if start < stop:
            out.append((start, stop))
        return out

    def skipped(self, batch: int) -> bool:
        """Whether data batch ``batch`` lies in a skipped range."""
        i = bisect.bisect_right(self.ranges, (batch, MAX_EXACT)) - 1
        return i >= 0 and batch < self.ranges[i][1]

    def kept_items(self, bounds: Sequence[int] | npt.NDArray[np.int64], first: int, batch: int) -> int:
        """The items of the batches from ``batch`` to the end of a window that are not skipped, ``bounds`` being
        where each batch ``first, first + 1, ...`` of the window starts (and its end): what a pass draws."""
        stop = first + len(bounds) - 1
        total = int(bounds[-1]) - int(bounds[batch - first])
        for a, b in self.ranges:
            lo, hi = max(a, batch), min(b, stop)
            if lo < hi:
                total -= int(bounds[hi - first]) - int(bounds[lo - first])
        return total
