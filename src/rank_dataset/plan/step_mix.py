"""A mix by steps: sources' weights that change at given steps, exact counts in every global batch. Pure numpy.

With weight schedules by step (``Source(..., weight={0: 1, 5000: 3}, by="step")``), global batch ``t`` of ``B``
items takes ``n_s(t)`` samples of source ``s``: the largest-remainder apportionment of ``B`` by the weights in
force at step ``t`` (exact rational arithmetic; equal remainders favour the earlier source), so a change lands
exactly at the first sample of that step's batch. Source ``s``'s samples are the next ``n_s(t)`` of its endless
stream of passes (pass ``j`` a permutation of its samples fixed by ``(seed, s, j)``): no sample of a source
repeats before all of it has been read. Within the batch, its ``B`` slots (the first ``n_0`` for source 0, then
source 1, ...) are shuffled by a permutation fixed by ``(seed, t)``; rank ``r`` takes its contiguous block of the
shuffled list, as for any step stream (:mod:`rank_dataset.plan.steps`). Nothing depends on the world size.

The stream's windows (the shards) are cut every ``T0 / M`` items, ``T0`` the mix's epoch size, as for a mix by
epochs; an "epoch" is then only a unit of shards.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.plan.mix import _source_seed
from rank_dataset.plan.permutation import permute, permute_stream

if TYPE_CHECKING:
    from rank_dataset.plan.steps import BatchSchedule

__all__ = ["StepMix", "batch_counts"]

_SLOT_KEY = 0x534C4F54  # keys the slot shuffle apart from the sources' streams


def batch_counts(size: int, weights: Sequence[float]) -> list[int]:
    """``size`` apportioned by ``weights`` by largest remainder (exact; ties favour the earlier source).

    Examples:
        >>> batch_counts(10, [1, 1, 1]), batch_counts(8, [3, 1])
        ([4, 3, 3], [6, 2])
    """
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    quotas = [size * w / whole for w in exact]
    counts = [int(q) for q in quotas]
    left = size - sum(counts)
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class StepMix:
    """The sizes of a mix's sources and their weights by step.

    Args:
        sizes: ``N_s`` of each source (each >= 1).
        weights: ``(first_step, (w_0, w_1, ...))`` pairs, sorted, the first at step 0: the weights in force
            from that step on.
    """

    sizes: tuple[int, ...]
    weights: tuple[tuple[int, tuple[float, ...]], ...]

    @classmethod
    def of(cls, sizes: Sequence[int], rules: Sequence[float | Mapping[int, float]]) -> StepMix:
        """From each source's weight: a number, or a schedule ``{first_step: weight}`` holding step 0."""
        steps = sorted({0, *(s for r in rules if isinstance(r, Mapping) for s in r)})
        table = []
        for step in steps:
            table.append((step, tuple(_in_force(r, step) for r in rules)))
        return cls(tuple(int(n) for n in sizes), tuple(table))

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "weights": [[s, list(w)] for s, w in self.weights]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepMix:
        return cls(tuple(data["sizes"]), tuple((int(s), tuple(float(x) for x in w)) for s, w in data["weights"]))

    def _runs(self, schedule: BatchSchedule, stop: int) -> list[tuple[int, int, int, npt.NDArray[np.int64]]]:
        """The steps ``[0, stop)`` as runs of one batch size and one set of weights: ``(first, end, size,
        counts)`` each (``end`` of the last run: ``stop``)."""
        cuts = sorted({s for s, _ in schedule.changes} | {s for s, _ in self.weights} | {stop})
        cuts = [c for c in cuts if c <= stop]
        runs = []
        for a, z in itertools.pairwise(cuts):
            size = schedule.size(a)
            weights = next(w for s, w in reversed(self.weights) if s <= a)
            runs.append((a, z, size, np.array(batch_counts(size, weights), np.int64)))
        return runs

    def samples(self, items: npt.NDArray[np.int64], schedule: BatchSchedule, seed: int) -> npt.NDArray[np.int64]:
        """The global sample numbers (over the sources in order) at stream items ``items``."""
        items = np.asarray(items, np.int64)
        out = np.empty(items.shape, np.int64)
        if not items.size:
            return out
        last = schedule.step_at(int(items.max()) + 1)
        runs = self._runs(schedule, last + 1)
        firsts = np.array([a for a, _, _, _ in runs], np.int64)
        sizes = np.array([b for _, _, b, _ in runs], np.int64)
        starts = np.array([schedule.start(a) for a, _, _, _ in runs], np.int64)
        taken = np.zeros((len(runs), len(self.sizes)), np.int64)  # each source's count before each run
        for j in range(1, len(runs)):
            a, z, _, counts = runs[j - 1]
            taken[j] = taken[j - 1] + (z - a) * counts
        run = np.searchsorted(starts, items, side="right") - 1
        rel = items - starts[run]
        step = firsts[run] + rel // sizes[run]
        slot_of = rel % sizes[run]
        source = np.empty(items.shape, np.int64)
        position = np.empty(items.shape, np.int64)
        slot_seed = (seed * 0x9E3779B1 + _SLOT_KEY) & ((1 << 63) - 1)
        # One step at a time (a window holds its share of T0 / M items: T0 / (M * B) steps).
        order = np.argsort(step, kind="stable")
        bounds = np.flatnonzero(np.diff(step[order])) + 1
        for group in np.split(order, bounds):
            t, j = int(step[group[0]]), int(run[group[0]])
            counts = runs[j][3]
            slots = permute(int(sizes[j]), slot_seed, t, slot_of[group])
            ends = np.cumsum(counts)
            of = np.searchsorted(ends, slots, side="right")
            source[group] = of
            position[group] = taken[j][of] + (t - int(firsts[j])) * counts[of] + slots - (ends[of] - counts[of])
        offset = 0
        for s, n in enumerate(self.sizes):
            where = source == s
            if where.any():
                out[where] = permute_stream(n, _source_seed(seed, s), 0, position[where]) + offset
            offset += n
        return out


def _in_force(rule: float | Mapping[int, float], step: int) -> float:
    if not isinstance(rule, Mapping):
        return float(rule)
    return float(rule[max(s for s in rule if s <= step)])
