"""Per-source accounting of a step stream: the items of each source that global batches ``[0, t)`` hold.

The stream of global batches is a pure function of the plan and the step (:mod:`rank_dataset.plan.steps`), so
what a run trained on is computed from them, not counted from what a rank saw: the same numbers on every rank
and any world size. An item is one entry of a global batch (with ``aug_repeats = k``, each of a draw's ``k``
copies). Items are split by *epoch of the stream* (epoch ``e`` holds draws ``[e * D, (e + 1) * D)``, ``D =
ceil(N / k)``; for batches by shape, the epoch in which a batch is completed), and by source (the sources of a
mix in order; one source without a mix).

The cost, for ``t`` steps over ``E`` epochs of ``S`` sources:

- without a mix: O(E), closed form;
- a mix by epochs: O(E x S) for the whole epochs; the epoch in progress is split by evaluating its slot
  permutation (:meth:`MixPlan.locate`'s) over the draws taken of it, vectorised, and the counter keeps that
  prefix so that a later call adds only the draws since (a monitor's summary every ``every`` steps evaluates
  ``every`` global batches' slots, a small part of what the loader itself computes);
- a mix by steps (:mod:`rank_dataset.plan.step_mix`): O(runs x S) over the runs of one batch size and one set
  of rules, plus the one global batch that straddles each epoch's start (its slot shuffle, O(B));
- batches by shape: by count, O(E); by budget, each epoch's batch table once (O(N) an epoch, kept).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_int
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.permutation import permute
from rank_dataset.plan.step_mix import batch_counts
from rank_dataset.plan.steps import StepLayout, draws_per_epoch

if TYPE_CHECKING:
    from rank_dataset.plan.mix import MixPlan
    from rank_dataset.plan.shapes import ShapeStream

__all__ = ["SourceCounter"]

_BLOCK = 1 << 20  # draws of a partial epoch evaluated at a time: bounded temporaries


class SourceCounter:
    """Counts each source's items in the global batches of a step layout.

    Args:
        layout: the stream's :class:`~rank_dataset.plan.steps.StepLayout` (a
            :class:`~rank_dataset.plan.shapes.ShapeLayout` for batches by shape).
        num_samples: the plan's samples (for a mix, its epoch size ``T0``).
        seed: the plan's seed.
        aug_repeats: ``k``.
        mix: the mix's plan, for a mix by epochs or by steps (None: plain files, one source).

    Example:
        >>> from rank_dataset.plan.schedule import BatchSchedule
        >>> counter = SourceCounter(StepLayout(BatchSchedule.of(4)), num_samples=10, seed=0)
        >>> counter.per_epoch(3).tolist()  # 12 items: epoch 0's 10, then 2 of epoch 1
        [[10], [2]]
    """

    def __init__(
        self,
        layout: StepLayout,
        num_samples: int,
        seed: int,
        aug_repeats: int = 1,
        mix: MixPlan | None = None,
    ) -> None:
        self.layout = layout
        self.num_samples = check_int("num_samples", num_samples, low=1)
        self.seed = seed
        self.k = check_int("aug_repeats", aug_repeats, low=1)
        self.mix = mix
        self.sources = 1 if mix is None else len(mix.sizes)
        self._draws = layout.schedule.in_draws(self.k)
        self._per_epoch = draws_per_epoch(self.num_samples, self.k)
        self._prefix: tuple[int, int, npt.NDArray[np.int64]] = (-1, 0, np.zeros(self.sources, np.int64))
        self._shape_epochs: dict[int, int] = {}  # by budget: the items of each whole epoch, once computed

    def per_epoch(self, stop: int) -> npt.NDArray[np.int64]:
        """The items of each source in global batches ``[0, stop)``: an int64 array ``(epochs, sources)``, row
        ``e`` the items of epoch ``e`` (no rows for ``stop = 0``)."""
        stop = check_int("step", stop, low=0)
        stream = getattr(self.layout, "stream", None)
        if stream is not None:
            return self._shapes(stream, stop)
        k, per = self.k, self._per_epoch
        q = self._draws.start(stop)  # draws of the steps before stop
        whole, part = divmod(q, per)
        rows = whole + (part > 0)
        out = np.zeros((rows, self.sources), np.int64)
        if self.mix is None:
            out[:whole, 0] = per
            if part:
                out[whole, 0] = part
        elif self.layout.mix is None:  # a mix by epochs
            cache: dict[tuple[int, ...], tuple[int, ...]] = {}
            for e in range(whole):
                counts = self.mix.counts_at(e)
                if counts not in cache:
                    cache[counts] = self.mix.draws(k, e)
                out[e] = cache[counts]
            if part:
                out[whole] = self._epoch_prefix(whole, part)
        else:  # a mix by steps: differences of the draws before each epoch's start
            before = self._step_mix_draws(0)
            for e in range(rows):
                after = self._step_mix_draws(min((e + 1) * per, q))
                out[e] = after - before
                before = after
        return out * k

    def per_epoch_of(self, ranges: list[tuple[int, int]]) -> npt.NDArray[np.int64]:
        """:meth:`per_epoch` of the global batches of half-open step ranges ``[(a, b), ...]`` (disjoint,
        ascending: those trained on, when others are skipped), rows up to the last epoch any of them reaches."""
        out = np.zeros((0, self.sources), np.int64)
        for a, b in ranges:
            if check_int("a range's end", b, low=0) <= check_int("a range's start", a, low=0):
                continue
            low, high = self.per_epoch(a), self.per_epoch(b)
            rows = max(len(out), len(high))
            grown = np.zeros((rows, self.sources), np.int64)
            grown[: len(out)] += out
            grown[: len(high)] += high
            grown[: len(low)] -= low
            out = grown
        return out

    def counts(self, stop: int) -> npt.NDArray[np.int64]:
        """The items of each source in global batches ``[0, stop)`` (a length-``sources`` int64 array)."""
        table = self.per_epoch(stop)
        return table.sum(axis=0) if len(table) else np.zeros(self.sources, np.int64)

    # -- a mix by epochs: the epoch in progress ------------------------------------------------------------

    def _epoch_prefix(self, epoch: int, stop: int) -> npt.NDArray[np.int64]:
        """Each source's draws among draws ``[0, stop)`` of ``epoch``'s order (the slot permutation of
        :meth:`MixPlan.locate`), from the prefix kept by the last call when it can."""
        assert self.mix is not None
        kept_epoch, kept_stop, kept = self._prefix
        counts: npt.NDArray[np.int64]
        if kept_epoch == epoch and kept_stop <= stop:
            start, counts = kept_stop, kept.copy()
        else:
            start, counts = 0, np.zeros(self.sources, np.int64)
        draws = self.mix.draws(self.k, epoch)
        total, bounds = sum(draws), Bounds(draws)
        for a in range(start, stop, _BLOCK):
            slots = permute(total, self.seed, epoch, np.arange(a, min(a + _BLOCK, stop), dtype=np.int64))
            counts += np.bincount(bounds.part_of(slots), minlength=self.sources)
        self._prefix = (epoch, stop, counts.copy())
        return counts

    # -- a mix by steps ----------------------------------------------------------------------------------

    def _step_mix_draws(self, q: int) -> npt.NDArray[np.int64]:
        """Each source's draws among the stream's draws ``[0, q)`` of a mix by steps."""
        assert self.mix is not None and self.layout.mix is not None
        rules, sched = self.layout.mix, self._draws
        u = sched.step_at(q)  # the first step starting at draw q or later
        whole = u if sched.start(u) == q else u - 1  # steps [0, whole) lie wholly before q
        out = np.zeros(self.sources, np.int64)
        cuts = sorted({s for s, _ in sched.changes} | {s for s, _ in rules.rules} | {whole})
        for a, z in itertools.pairwise(c for c in cuts if c <= whole):
            out += (z - a) * np.array(batch_counts(sched.size(a), rules.shares(a)), np.int64)
        first = sched.start(whole)
        if first < q:  # the straddling step: its first q - first draws, by its slot shuffle
            samples = rules.samples(np.arange(first, q, dtype=np.int64), sched, self.seed)
            out += np.bincount(Bounds(self.mix.sizes).part_of(samples), minlength=self.sources)
        return out

    # -- batches by shape --------------------------------------------------------------------------------

    def _shapes(self, stream: ShapeStream, stop: int) -> npt.NDArray[np.int64]:
        """One source; each global batch counted in the epoch that completes it."""
        if stop == 0:
            return np.zeros((0, 1), np.int64)
        last = stream.epoch_of(stop - 1)
        out = np.zeros((last + 1, 1), np.int64)
        for e in range(last + 1):
            base, end = stream.steps_before(e), stream.steps_before(e + 1)
            if stream.batch_size is not None:
                out[e, 0] = (min(end, stop) - base) * stream.batch_size
            elif end <= stop and e in self._shape_epochs:
                out[e, 0] = self._shape_epochs[e]
            else:
                offsets = stream.batch_offsets(e)
                out[e, 0] = int(offsets[min(end, stop) - base])
                if end <= stop:
                    self._shape_epochs[e] = int(out[e, 0])
        return out
