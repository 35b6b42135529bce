"""A mix by steps: sources' rules (weight, repeat, choose) that change at given steps, exact counts in every
global batch.

With a schedule by step (``Source(..., weight={0: 1, 5000: 3}, by="step")``), the rules in force at step ``t``
give each source ``s`` its per-epoch share ``c_s(t)`` of the epoch size ``T0`` (that of the rules at step 0), as
:func:`~rank_dataset.plan.counts.mix_counts` does for an epoch, a weight's share left unrounded. Global batch
``t`` of ``B`` items (``B / k`` draws with ``aug_repeats = k``) takes ``n_s(t)`` draws of source ``s``: the
largest-remainder apportionment of its draws in proportion to the ``c_s(t)`` (ties favour the earlier source),
the next ``n_s(t)`` of the source's endless stream of passes. Within the batch the draw slots are shuffled by a
permutation fixed by ``(seed, t)``, and rank ``r`` takes its block as for any step stream
(:mod:`rank_dataset.plan.steps`). Nothing depends on the world size.

The stream's windows (the shards) are cut every ``T0 / M`` items, as for a mix by epochs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.plan.counts import batch_counts
from rank_dataset.plan.mix import source_seed
from rank_dataset.plan.permutation import grid_each, permute_keyed, permute_stream, round_keys_each
from rank_dataset.plan.schedule import in_force_at
from rank_dataset.plan.sources import Source, in_force

if TYPE_CHECKING:
    from fractions import Fraction

    from rank_dataset.plan.schedule import BatchSchedule

__all__ = ["StepMix"]

_SLOT_KEY = 0x534C4F54  # keys the slot shuffle apart from the sources' streams


_KINDS = ("weight", "repeat", "choose")


@dataclass(frozen=True)
class StepMix:
    """The sizes of a mix's sources, its epoch size and their rules by step.

    Args:
        sizes: ``N_s`` of each source (each >= 1).
        epoch_size: ``T0``, the unit of the shares (the mix's epoch size).
        kinds: each source's rule: ``"weight"``, ``"repeat"`` or ``"choose"``.
        rules: ``(first_step, (v_0, v_1, ...))`` pairs, sorted, the first at step 0: the rules' values in force
            from that step on.

    Example:
        >>> mix = StepMix.of([100, 50], 100, ["weight", "choose"], [1, {0: 10, 5: 40}])
        >>> mix.shares(0), mix.shares(7)
        ((Fraction(90, 1), Fraction(10, 1)), (Fraction(60, 1), Fraction(40, 1)))
    """

    sizes: tuple[int, ...]
    epoch_size: int
    kinds: tuple[str, ...]
    rules: tuple[tuple[int, tuple[float, ...]], ...]

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in _KINDS]
        if bad or len(self.kinds) != len(self.sizes):
            raise ValueError(
                f"a StepMix needs a kind in {_KINDS} for each of its {len(self.sizes)} sources, got {self.kinds!r}"
            )
        rules = tuple(
            (int(s), tuple(int(x) if k == "choose" else float(x) for k, x in zip(self.kinds, v))) for s, v in self.rules
        )
        object.__setattr__(self, "rules", rules)

    @classmethod
    def of(
        cls,
        sizes: Sequence[int],
        epoch_size: int,
        kinds: Sequence[str],
        rules: Sequence[float | Mapping[int, float]],
        names: Sequence[str] | None = None,
    ) -> StepMix:
        """From each source's rule: a value, or a schedule ``{first_step: value}`` holding step 0.

        Raises:
            ValueError: naming the source and the step: a repeat that rounds to 0 samples, or fixed counts
                that leave nothing of ``T0`` to the weighted sources.
        """
        if len(rules) != len(sizes):
            raise ValueError(f"a StepMix needs a rule for each of its {len(sizes)} sources")
        steps = sorted({0, *(s for r in rules if isinstance(r, Mapping) for s in r)})
        table = tuple((step, tuple(in_force(r, step) for r in rules)) for step in steps)
        mix = cls(tuple(int(n) for n in sizes), int(epoch_size), tuple(kinds), table)
        names = names or [str(s) for s in range(len(sizes))]
        for step, values in mix.rules:
            mix._shares(values, step, names)  # raises on what cannot be met
        return mix

    @classmethod
    def from_sources(cls, sizes: Sequence[int], sources: Sequence[Source], epoch_size: int) -> StepMix | None:
        """The rules by step of a mix in which some source has a schedule by step (``by="step"``); None if none.

        Raises:
            ValueError: a source with a schedule by epoch in such a mix (naming it), or as :meth:`of`.
        """
        if all(s.step_rule is None for s in sources):
            return None
        for s in sources:
            if s.step_rule is None and s.changes:
                raise ValueError(
                    f"source {s.name!r} has a schedule by epoch in a mix whose rules change by step: give it a value, "
                    "or its schedule by step (Source(..., by='step'))"
                )
        rules = [getattr(s, s.kind) if s.step_rule is None else s.step_rule for s in sources]
        return cls.of(sizes, epoch_size, [s.kind for s in sources], rules, [s.name for s in sources])

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "epoch_size": self.epoch_size,
            "kinds": list(self.kinds),
            "rules": [[s, list(v)] for s, v in self.rules],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepMix:
        return cls(tuple(data["sizes"]), int(data["epoch_size"]), tuple(data["kinds"]), tuple(data["rules"]))

    def shares(self, step: int) -> tuple[Fraction, ...]:
        """``c_s(step)``: each source's share of ``T0`` by the rules in force at ``step`` (exact)."""
        return self._shares(in_force_at(self.rules, step), step)

    def _shares(self, values: Sequence[float], step: int, names: Sequence[str] | None = None) -> tuple[Fraction, ...]:
        """The shares of the rules' ``values`` (in force from ``step``); ValueError naming what cannot be met."""
        from fractions import Fraction  # on first use: it imports decimal

        label = names or [str(s) for s in range(len(self.sizes))]
        shares: list[Fraction] = []
        weighted = []
        for s, (kind, value, n) in enumerate(zip(self.kinds, values, self.sizes)):
            if kind == "weight":
                weighted.append(s)
                shares.append(Fraction(value))
            elif kind == "choose":
                shares.append(Fraction(int(value)))
            else:
                count = round(value * n)  # as mix_counts: Python's round, halves to even
                if count == 0:
                    raise ValueError(
                        f"source {label[s]!r}: repeat={value:g} of its {n} samples rounds to 0 per epoch "
                        f"from step {step}"
                    )
                shares.append(Fraction(count))
        if weighted:
            fixed = sum(shares[s] for s in range(len(shares)) if s not in weighted)
            left = self.epoch_size - fixed
            if left <= 0:
                raise ValueError(
                    f"from step {step} the fixed per-epoch counts of the sources add up to {fixed}, leaving nothing of "
                    f"the epoch size {self.epoch_size} to the weighted source(s) "
                    f"{', '.join(repr(label[s]) for s in weighted)}: lower them or set reload_cfg['epoch_size']"
                )
            whole = sum(shares[s] for s in weighted)
            for s in weighted:
                shares[s] = left * shares[s] / whole
        return tuple(shares)

    def _runs(self, schedule: BatchSchedule, stop: int) -> list[tuple[int, int, int, npt.NDArray[np.int64]]]:
        """The steps ``[0, stop)`` as runs of one batch size (in draws) and one set of rules: ``(first, end, size,
        counts)`` each (``end`` of the last run: ``stop``)."""
        cuts = sorted({s for s, _ in schedule.changes} | {s for s, _ in self.rules} | {stop})
        cuts = [c for c in cuts if c <= stop]
        runs = []
        for a, z in itertools.pairwise(cuts):
            size = schedule.size(a)
            runs.append((a, z, size, np.array(batch_counts(size, self.shares(a)), np.int64)))
        return runs

    def samples(self, items: npt.NDArray[np.int64], schedule: BatchSchedule, seed: int) -> npt.NDArray[np.int64]:
        """The global sample numbers (over the sources in order) at stream draws ``items``, ``schedule`` the
        draws of each global batch (``B(t) / k``)."""
        source, position = self.locate(items, schedule, seed)
        out = np.empty(source.shape, np.int64)
        offset = 0
        for s, n in enumerate(self.sizes):
            where = source == s
            if where.any():
                out[where] = permute_stream(n, source_seed(seed, s), 0, position[where]) + offset
            offset += n
        return out

    def taken(self, schedule: BatchSchedule, step: int) -> tuple[int, ...]:
        """Each source's draws in the global batches before ``step`` (its stream position there)."""
        taken = [0] * len(self.sizes)
        for a, z, _, counts in self._runs(schedule, step):
            for s, c in enumerate(counts.tolist()):
                taken[s] += (z - a) * c
        return tuple(taken)

    def locate(
        self, items: npt.NDArray[np.int64], schedule: BatchSchedule, seed: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The source of each stream draw ``items`` and its position in that source's stream (see :meth:`samples`)."""
        items = np.asarray(items, np.int64)
        if not items.size:
            return np.empty(items.shape, np.int64), np.empty(items.shape, np.int64)
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
        slot_seed = (seed * 0x9E3779B1 + _SLOT_KEY) & ((1 << 63) - 1)
        # Every step's slot shuffle at once (a window holds T0 / (M * B) steps: a call each would cost more than
        # the rest): the round keys of each step met, then one keyed pass, as permute(B, slot_seed, t, .) gives.
        low = int(step.min())
        met = np.arange(low, int(step.max()) + 1, dtype=np.int64)  # the steps of a window: a short range
        keys = [k[step - low] for k in round_keys_each(np.full(met.size, slot_seed, np.uint64), met)]
        rows, col_bits = grid_each(sizes)  # a grid a run, each item given its run's
        slots = permute_keyed(sizes[run], rows[run], col_bits[run], keys, slot_of)
        source = np.empty(items.shape, np.int64)
        position = np.empty(items.shape, np.int64)
        for j in range(int(run.min()), int(run.max()) + 1):  # a run: one size and one set of counts
            where = np.flatnonzero(run == j) if len(runs) > 1 else np.arange(run.size)
            if not where.size:
                continue
            counts = runs[j][3]
            ends = np.cumsum(counts)
            mine = slots[where]
            of = np.searchsorted(ends, mine, side="right")
            source[where] = of
            position[where] = (
                taken[j][of] + (step[where] - int(firsts[j])) * counts[of] + mine - (ends[of] - counts[of])
            )
        return source, position
