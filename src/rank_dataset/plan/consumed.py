"""Per-source accounting of a step stream: the items of each source that global batches ``[0, t)`` hold.

The stream of global batches is a pure function of the plan and the step (:mod:`rank_dataset.plan.steps`), so
what a run trained on is computed from them, not counted from what a rank saw: the same numbers on every rank
and any world size. An item is one entry of a global batch (with ``aug_repeats = k``, each of a draw's ``k``
copies). Items are split by *epoch of the stream* (epoch ``e`` holds draws ``[e * D, (e + 1) * D)``, ``D =
ceil(N / k)``; for batches by shape, the epoch in which a batch is completed), and by source (the sources of a
mix in order; one source without a mix).

Whole epochs are counted in closed form; an epoch in progress of a mix evaluates its slot permutation over the
draws taken of it once (kept: a later call adds only the draws since).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_int, check_ints
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.permutation import permute
from rank_dataset.plan.step_state import json_digest
from rank_dataset.plan.steps import StepLayout, draws_per_epoch

if TYPE_CHECKING:
    from rank_dataset.plan.mix import MixPlan
    from rank_dataset.plan.shapes import ShapeStream

__all__ = ["ANCHOR_KEY", "RunCounter", "SourceCounter", "check_anchor"]

_BLOCK = 1 << 20  # draws of a partial epoch evaluated at a time: bounded temporaries
_ANCHORS = 4  # known prefixes kept an epoch (the monitor's step, the state's, the sampler's, a loaded one)

#: The key of a step state that holds the run's counts of the epoch in progress (:meth:`RunCounter.anchor_at`).
ANCHOR_KEY = "counted"


class SourceCounter:
    """Counts each source's items in the global batches of a step layout.

    Args:
        layout: the stream's :class:`~rank_dataset.plan.steps.StepLayout` (a
            :class:`~rank_dataset.plan.shapes.ShapeLayout` for batches by shape).
        num_samples: the plan's samples (for a mix, its epoch size ``T0``).
        seed: the plan's seed.
        aug_repeats: ``k``.
        mix: the mix's plan, for a mix by epochs or by steps (None: plain files, one source).
        sizes: for a mix by steps without its MixPlan (a segment of a run with mixture edits), its sources'
            sizes.
        origin: the run draw at which the counted stream starts (a segment's first draw; its epochs count
            from there).

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
        *,
        sizes: Sequence[int] | None = None,
        origin: int = 0,
    ) -> None:
        self.layout = layout
        self.num_samples = check_int("num_samples", num_samples, low=1)
        self.seed = seed
        self.k = check_int("aug_repeats", aug_repeats, low=1)
        self.mix = mix
        self.sizes = tuple(sizes) if sizes is not None else (None if mix is None else mix.sizes)
        self.sources = 1 if self.sizes is None else len(self.sizes)
        self.origin = check_int("origin", origin, low=0)
        self.evaluated = 0  # slots of a partial epoch evaluated so far (what a first call after a resume costs)
        self._draws = layout.schedule.in_draws(self.k)
        self._per_epoch = draws_per_epoch(self.num_samples, self.k)
        self._anchors: dict[int, list[tuple[int, npt.NDArray[np.int64]]]] = {}  # epoch -> known prefixes
        self._shape_epochs: dict[int, int] = {}  # by budget: the items of each whole epoch, once computed

    @property
    def by_epochs(self) -> bool:
        """A mix by epochs: the one kind whose epoch in progress is counted by evaluating its draws."""
        return self.mix is not None and self.layout.mix is None and getattr(self.layout, "stream", None) is None

    @property
    def epoch_draws(self) -> int:
        """``D``: the draws of one of the counted stream's epochs."""
        return self._per_epoch

    def per_epoch(self, stop: int) -> npt.NDArray[np.int64]:
        """The items of each source in global batches ``[0, stop)``: an int64 array ``(epochs, sources)``, row
        ``e`` the items of epoch ``e`` (no rows for ``stop = 0``)."""
        stop = check_int("step", stop, low=0)
        stream = getattr(self.layout, "stream", None)
        if stream is not None:
            return self._shapes(stream, stop)
        return self.rows(self._draws.start(stop))

    def rows(self, q: int) -> npt.NDArray[np.int64]:
        """The items of each source among the run's draws ``[origin, q)``, a row an epoch (counted from
        ``origin``)."""
        k, per = self.k, self._per_epoch
        r = max(q - self.origin, 0)
        whole, part = divmod(r, per)
        rows = whole + (part > 0)
        out = np.zeros((rows, self.sources), np.int64)
        if self.layout.mix is not None:  # a mix by steps: differences of the draws before each epoch's start
            before = self._step_mix_draws(self.origin)
            for e in range(rows):
                after = self._step_mix_draws(self.origin + min((e + 1) * per, r))
                out[e] = after - before
                before = after
        elif self.mix is None:
            out[:whole, 0] = per
            if part:
                out[whole, 0] = part
        else:  # a mix by epochs
            cache: dict[tuple[int, ...], tuple[int, ...]] = {}
            for e in range(whole):
                counts = self.mix.counts_at(e)
                if counts not in cache:
                    cache[counts] = self.mix.draws(k, e)
                out[e] = cache[counts]
            if part:
                out[whole] = self._epoch_prefix(whole, part)
        return out * k

    def counts(self, stop: int) -> npt.NDArray[np.int64]:
        """The items of each source in global batches ``[0, stop)`` (a length-``sources`` int64 array)."""
        table = self.per_epoch(stop)
        return table.sum(axis=0) if len(table) else np.zeros(self.sources, np.int64)

    # -- a mix by epochs: the epoch in progress ------------------------------------------------------------

    def anchor(self, epoch: int, stop: int, draws: Sequence[int]) -> None:
        """Record that draws ``[0, stop)`` of ``epoch`` (counted from ``origin``) hold ``draws[s]`` of each source
        ``s`` (a state's or an edit's count): a later count in that epoch evaluates only the draws between."""
        counts = np.array(check_ints("an anchor's draws", draws, low=0), np.int64)
        if counts.size != self.sources:
            raise ValueError(f"an anchor counts {self.sources} sources, got {counts.size}: {list(draws)}")
        self._remember(check_int("an anchor's epoch", epoch, low=0), check_int("an anchor's stop", stop, low=0), counts)

    def prefix(self, q: int) -> tuple[int, int, npt.NDArray[np.int64]] | None:
        """For a mix by epochs: the epoch (from ``origin``) of run draw ``q``, its draws before ``q`` and each
        source's among them (None: another kind, whose counts cost nothing to recompute)."""
        if not self.by_epochs:
            return None
        epoch, d = divmod(max(q - self.origin, 0), self._per_epoch)
        return epoch, d, self._epoch_prefix(epoch, d)

    def _remember(self, epoch: int, stop: int, counts: npt.NDArray[np.int64]) -> None:
        known = [a for a in self._anchors.get(epoch, []) if a[0] != stop]
        self._anchors = {e: v for e, v in self._anchors.items() if e >= epoch - 1}  # older epochs are done
        self._anchors[epoch] = [*known[-(_ANCHORS - 1) :], (stop, counts.copy())]

    def _epoch_prefix(self, epoch: int, stop: int) -> npt.NDArray[np.int64]:
        """Each source's draws among draws ``[0, stop)`` of ``epoch``'s order (the slot permutation of
        :meth:`MixPlan.locate`), from the nearest prefix known (the epoch's start or end, a state's or an
        edit's anchor, an earlier call's): only the draws between are evaluated."""
        assert self.mix is not None
        draws = self.mix.draws(self.k, epoch)
        total, bounds = sum(draws), Bounds(draws)
        known = [(0, np.zeros(self.sources, np.int64)), (total, np.array(draws, np.int64))]
        at, base = min([*known, *self._anchors.get(epoch, [])], key=lambda a: abs(a[0] - stop))
        counts: npt.NDArray[np.int64] = base.copy()
        lo, hi, sign = (at, stop, 1) if at <= stop else (stop, at, -1)
        for a in range(lo, hi, _BLOCK):
            slots = permute(total, self.seed, epoch, np.arange(a, min(a + _BLOCK, hi), dtype=np.int64))
            counts += sign * np.bincount(bounds.part_of(slots), minlength=self.sources)
            self.evaluated += slots.size
        if at != stop:
            self._remember(epoch, stop, counts)
        return counts

    # -- a mix by steps ----------------------------------------------------------------------------------

    def _step_mix_draws(self, q: int) -> npt.NDArray[np.int64]:
        """Each source's draws among the stream's draws ``[0, q)`` of a mix by steps."""
        assert self.sizes is not None and self.layout.mix is not None
        rules, sched = self.layout.mix, self._draws
        u = sched.step_at(q)  # the first step starting at draw q or later
        whole = u if sched.start(u) == q else u - 1  # steps [0, whole) lie wholly before q
        out = np.array(rules.taken(sched, whole), np.int64)
        first = sched.start(whole)
        if first < q:  # the straddling step: its first q - first draws, by its slot shuffle
            samples = rules.samples(np.arange(first, q, dtype=np.int64), sched, self.seed)
            out += np.bincount(Bounds(self.sizes).part_of(samples), minlength=self.sources)
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


def _plus(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], sign: int = 1) -> npt.NDArray[np.int64]:
    """``a + sign * b``, row by row (epoch by epoch), as long as the longer."""
    out = np.zeros((max(len(a), len(b)), a.shape[1]), np.int64)
    out[: len(a)] += a
    out[: len(b)] += sign * b
    return out


class RunCounter:
    """Counts each source's items in the global batches a run trained on, across its mixture edits.

    Without edits the run is one segment, counted by one :class:`SourceCounter` over the layout. With edits
    (``layout.remix``, a :class:`~rank_dataset.plan.remix.RemixChain`) each segment is counted by its own, from
    its first draw, its epochs counted from there (as the chain counts them); the epoch in progress at each edit
    is anchored at the counts the edit found (:attr:`Edit.consumed`), so that nothing before it is evaluated
    again. Sources are the segment's (a source kept across an edit counts under its name in both).

    Args:
        layout: the stream's layout.
        num_samples, seed, aug_repeats, mix: the plan's, as :class:`SourceCounter` takes them (the mix in force
            now; a chain's segments hold their own).
    """

    def __init__(
        self, layout: StepLayout, num_samples: int, seed: int, aug_repeats: int = 1, mix: MixPlan | None = None
    ) -> None:
        chain = getattr(layout, "remix", None)
        self._draws = layout.schedule.in_draws(aug_repeats)
        if chain is None:
            self.steps = [0]
            self.counters = [SourceCounter(layout, num_samples, seed, aug_repeats, mix)]
            return
        from rank_dataset.plan.mix import MixPlan as Plan
        from rank_dataset.plan.step_mix import StepMix

        self.steps = [s.step for s in chain.segments]
        self.counters = [
            SourceCounter(
                StepLayout(layout.schedule, segment.mix if isinstance(segment.mix, StepMix) else None),
                segment.num_samples,
                seed,
                aug_repeats,
                segment.mix if isinstance(segment.mix, Plan) else None,
                sizes=None if segment.kind == "plain" else [s.size for s in segment.sources],
                origin=self._draws.start(segment.step),
            )
            for segment in chain.segments
        ]
        for counter, edit in zip(self.counters, chain.edits):  # the epoch in progress at each edit: counted
            if counter.by_epochs:
                at = self._draws.start(edit.step) - counter.origin - edit.epoch[0] * counter.epoch_draws
                counter.anchor(edit.epoch[0], at, edit.consumed)

    def per_segment(self, ranges: list[tuple[int, int]]) -> list[tuple[int, npt.NDArray[np.int64]]]:
        """For each segment that starts before the last range's end: its first data batch and its sources' items
        in the data batches of ``ranges`` (half-open, disjoint, ascending: those trained on), a row an epoch of
        the segment."""
        stop = max((b for _, b in ranges), default=0)
        out = []
        for i, (first, counter) in enumerate(zip(self.steps, self.counters)):
            if i and first >= stop:
                break
            end = self.steps[i + 1] if i + 1 < len(self.steps) else None
            rows = np.zeros((0, counter.sources), np.int64)
            for a, b in ranges:
                lo, hi = max(a, first), b if end is None else min(b, end)
                if lo < hi:
                    rows = _plus(rows, _plus(counter.per_epoch(hi), counter.per_epoch(lo), -1))
            out.append((first, rows))
        return out

    def anchor_at(self, batch: int) -> dict[str, Any] | None:
        """What a state saved at data batch ``batch`` carries so that a resume counts without evaluating the
        epoch in progress again: for a mix by epochs in force at ``batch``, ``{"segment": its first data batch,
        "mix": its digest, "epoch", "at": draws of the epoch before batch's, "draws": each source's among them}``
        (None: nothing to carry, its counts are closed forms)."""
        i = int(np.searchsorted(self.steps, batch, side="right")) - 1
        counter = self.counters[i]
        found = counter.prefix(self._draws.start(batch))
        if found is None or counter.mix is None:
            return None
        epoch, at, draws = found
        return {
            "segment": self.steps[i],
            "mix": json_digest(counter.mix.to_dict()),
            "epoch": epoch,
            "at": at,
            "draws": draws.tolist(),
        }

    def seed(self, anchor: Any) -> None:
        """Take a state's :meth:`anchor_at` (ignored unless its segment is one of this run's, the same mix).

        Raises:
            ValueError: not such a dict (naming what is invalid).
        """
        check_anchor(anchor)
        segment = anchor["segment"]
        if segment in self.steps:
            counter = self.counters[self.steps.index(segment)]
            if counter.by_epochs and counter.mix is not None and json_digest(counter.mix.to_dict()) == anchor["mix"]:
                counter.anchor(anchor["epoch"], anchor["at"], anchor["draws"])


def check_anchor(anchor: Any) -> None:
    """Raise ValueError unless ``anchor`` is one of :meth:`RunCounter.anchor_at`'s dicts."""
    keys = {"segment", "mix", "epoch", "at", "draws"}
    if not isinstance(anchor, Mapping) or set(anchor) != keys or not isinstance(anchor["mix"], str):
        raise ValueError(
            f"invalid step state: {ANCHOR_KEY} must be a dict of segment, mix, epoch, at and draws, got {anchor!r}"
        )
    for key in ("segment", "epoch", "at"):
        check_int(f"the state's {ANCHOR_KEY} {key}", anchor[key], low=0)
    if not isinstance(anchor["draws"], list):
        raise ValueError(f"invalid step state: {ANCHOR_KEY} draws must be a list, got {anchor['draws']!r}")
    check_ints(f"the state's {ANCHOR_KEY} draws", anchor["draws"], low=0)
