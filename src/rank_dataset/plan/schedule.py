"""A global batch size by step: a schedule ``{first_step: size}`` and the stream positions it implies."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rank_dataset.core.checks import check_int

__all__ = ["BatchSchedule", "in_force_at"]

_T = TypeVar("_T")


def in_force_at(changes: Sequence[tuple[int, _T]], at: int) -> _T:
    """The value in force at ``at`` of ``changes``, ``(first, value)`` pairs ascending by ``first`` (before the
    first: the first value).

    Example:
        >>> in_force_at(((0, "a"), (5, "b")), 4), in_force_at(((0, "a"), (5, "b")), 5)
        ('a', 'b')
    """
    return changes[max(bisect.bisect_right(changes, at, key=lambda c: c[0]) - 1, 0)][1]


@dataclass(frozen=True)
class BatchSchedule:
    """A global batch size by step: ``changes`` are ``(first_step, size)`` pairs, the first at step 0.

    Examples:
        >>> s = BatchSchedule.of({0: 4, 3: 8})
        >>> [s.size(t) for t in range(5)], s.start(5), s.step_at(20)
        ([4, 4, 4, 8, 8], 28, 4)
    """

    changes: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, value: Any, name: str = "global_batch_size") -> BatchSchedule:
        """A schedule from an int (one size) or a mapping ``{first_step: size}`` that holds step 0 (keys may be
        strings of digits, as JSON saves them). Raises TypeError or ValueError naming what is wrong."""
        if isinstance(value, BatchSchedule):
            return value
        if not isinstance(value, Mapping):
            return cls(((0, check_int(name, value, low=1)),))
        if not value:
            raise ValueError(f"{name} must hold step 0, got an empty schedule")
        pairs = []
        for step, size in value.items():
            if isinstance(step, str) and step.isdigit():
                step = int(step)
            step = check_int(f"a step of {name}", step, low=0)
            pairs.append((step, check_int(f"{name} at step {step}", size, low=1)))
        pairs.sort()
        if pairs[0][0] != 0:
            raise ValueError(f"{name} must hold step 0 (the size of the first global batch), got steps {value!r}")
        if len({s for s, _ in pairs}) != len(pairs):
            raise ValueError(f"{name} names a step twice: {value!r}")
        return cls(tuple(pairs))

    def check(self, world_size: int, aug_repeats: int = 1, name: str = "global_batch_size") -> None:
        """Raise ValueError naming the step and the size if a size is not a multiple of ``world_size``
        (each rank takes ``B / W``) and of ``aug_repeats`` (a batch holds ``B / k`` whole draws)."""
        for step, size in self.changes:
            if size % world_size:
                raise ValueError(
                    f"{name} {size} at step {step} is not a multiple of the world size {world_size}: "
                    "each rank takes size / world_size items of a global batch"
                )
            if size % aug_repeats:
                raise ValueError(
                    f"{name} {size} at step {step} is not a multiple of aug_repeats={aug_repeats}: "
                    "a global batch holds every copy of its draws"
                )

    def to_dict(self) -> dict[str, int]:
        """``{str(first_step): size}``: JSON-safe, read back by :meth:`of`."""
        return {str(s): b for s, b in self.changes}

    def in_draws(self, aug_repeats: int) -> BatchSchedule:
        """The schedule of each global batch's draws, ``B(t) / k`` (itself for ``k = 1``; ``k`` divides every
        size, as :meth:`check` requires)."""
        if aug_repeats == 1:
            return self
        return BatchSchedule(tuple((s, b // aug_repeats) for s, b in self.changes))

    def size(self, step: int) -> int:
        """``B(step)``."""
        return in_force_at(self.changes, step)

    def start(self, step: int) -> int:
        """``S(step)``: the items of the global batches before ``step``."""
        total = 0
        for i, (first, b) in enumerate(self.changes):
            if step <= first:
                break
            end = self.changes[i + 1][0] if i + 1 < len(self.changes) else step
            total += b * (min(step, end) - first)
        return total

    def step_at(self, item: int) -> int:
        """The first step whose global batch starts at stream item ``item`` or later."""
        total = 0
        for i, (first, b) in enumerate(self.changes):
            end = self.changes[i + 1][0] if i + 1 < len(self.changes) else None
            span = None if end is None else b * (end - first)
            if span is None or item <= total + span:
                return first + max(0, -(-(item - total) // b))
            total += span
        raise AssertionError("unreachable: the last size runs for ever")  # pragma: no cover

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """The steps ``[lo, hi)`` as runs of one size: ``(first, stop, size, S(first))`` each."""
        runs = []
        for i, (first, b) in enumerate(self.changes):
            end = self.changes[i + 1][0] if i + 1 < len(self.changes) else hi
            a, z = max(first, lo), min(end, hi)
            if a < z:
                runs.append((a, z, b, self.start(a)))
        return runs
