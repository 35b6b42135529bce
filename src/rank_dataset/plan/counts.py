"""How many samples each source of a mix gives an epoch: counts, draws, targets and schedules. The mixing
model: :mod:`rank_dataset.plan.mix`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rank_dataset.core.checks import MAX_EXACT, check_int
from rank_dataset.plan.sources import Source

if TYPE_CHECKING:
    from fractions import Fraction

__all__ = ["batch_counts", "mix_counts", "mix_draws", "mix_schedule", "mix_targets"]


def mix_counts(
    sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None, epoch: int = 0
) -> tuple[list[int], int]:
    """Per-epoch counts ``c_s`` of each source and the epoch size ``T0 = sum(c_s)``, by the rules in
    force at ``epoch`` (see :meth:`~rank_dataset.plan.sources.Source.at`).

    ``repeat=r`` takes ``round(r * N_s)`` (Python's round: halves to even), ``choose=k`` takes ``k``,
    and the weighted sources share what is left of ``T0`` in proportion to their weights, by largest
    remainder (exact rational arithmetic; equal remainders favour the earlier source). ``T0`` is
    ``epoch_size`` if given, else the sum of the fixed counts when no source has a weight, else the
    total number of samples of all sources.

    Args:
        sizes: ``N_s``, the number of samples of each source (each >= 1), in the order of ``sources``.
        sources: the sources; at least one.
        epoch_size: ``T0``, an int >= 1, or None for the default above.
        epoch: the epoch whose rules count (only sources with a schedule depend on it).

    Raises:
        ValueError: naming the source (and the epoch, past 0), if a source is empty, a repeat rounds
            to 0, the fixed counts exceed ``T0``, a weighted share rounds to 0, or, without weighted
            sources, the fixed counts do not add up to ``epoch_size``.

    Examples:
        >>> mix_counts([100, 10, 50], [Source("a", weight=1), Source("b", repeat=2.5), Source("c", weight=2)], 100)
        ([25, 25, 50], 100)
        >>> mix_counts([100, 10], [Source("a"), Source("b", choose=30)], None)
        ([100, 30], 130)
    """
    if isinstance(sources, Source) or not isinstance(sources, Sequence):
        raise TypeError(f"sources must be a list of Source, got {type(sources).__name__}")
    if not sources:
        raise ValueError("sources must not be empty")
    if len(sizes) != len(sources):
        raise ValueError(f"sizes has {len(sizes)} entries for {len(sources)} sources")
    for i, source in enumerate(sources):
        if not isinstance(source, Source):
            raise TypeError(f"sources[{i}] must be a Source, got {source!r} ({type(source).__name__})")
    names = [repr(source.name) for source in sources]
    epoch = check_int("epoch", epoch, low=0)
    if all(type(n) is int and n >= 1 for n in sizes):
        ns = list(sizes)
    else:
        ns = [check_int(f"size of source {name}", n, low=1) for name, n in zip(names, sizes)]
    counts: list[int] = [0] * len(sources)
    weighted = []
    for i, (source, n, name) in enumerate(zip(sources, ns, names)):
        value = source.value_at(epoch)
        if source.kind == "weight":
            weighted.append(i)
        elif source.kind == "choose":
            counts[i] = int(value)
        else:
            counts[i] = round(value * n)
            if counts[i] == 0:
                when = f" from epoch {epoch}" if epoch else ""
                raise ValueError(f"source {name}: repeat={value} of its {n} samples rounds to 0 per epoch{when}")
    fixed = sum(counts)
    if epoch_size is not None:
        total = check_int("epoch_size", epoch_size, low=1)
        why = f"epoch_size={total}"
    elif weighted:
        total, why = sum(ns), f"the epoch size, by default the total number of samples ({sum(ns)})"
    else:
        total, why = fixed, ""
    if not 1 <= total <= MAX_EXACT:
        raise ValueError(f"the epoch size must be in [1, 2**62], got {total}")
    if epoch:
        why += f" (at epoch {epoch}, by the schedules)"
    if fixed > total:
        listed = ", ".join(f"{names[i]}: {counts[i]}" for i in range(len(sources)) if counts[i])
        raise ValueError(f"the fixed per-epoch counts of the sources ({listed}) add up to {fixed}, more than {why}")
    if not weighted:
        if fixed < total:
            raise ValueError(
                f"the fixed per-epoch counts add up to {fixed}, less than {why}, and no source has a weight to fill "
                "the rest: give a source a weight, or leave epoch_size unset"
            )
        return counts, total
    left = total - fixed
    for i, count in zip(weighted, batch_counts(left, [float(sources[i].value_at(epoch)) for i in weighted])):
        counts[i] = count
    zero = [names[i] for i in weighted if counts[i] == 0]
    if zero:
        raise ValueError(
            f"the weighted share of source(s) {', '.join(zero)} rounds to 0 of the {left} samples that the fixed "
            f"counts leave of {why}: raise their weight or the epoch size"
        )
    return counts, total


def batch_counts(size: int, weights: Sequence[float | Fraction]) -> list[int]:
    """``size`` apportioned by ``weights`` by largest remainder (exact; ties favour the earlier source).

    Examples:
        >>> batch_counts(10, [1, 1, 1]), batch_counts(8, [3, 1])
        ([4, 3, 3], [6, 2])
    """
    # Exact rationals as integers (an int's, a float's and a Fraction's ratios are exact): each weight times the
    # common denominator; its quota size * w / whole, floor and remainder by one integer division.
    ratios = [w.as_integer_ratio() for w in weights]
    denominator = math.lcm(*(d for _, d in ratios))
    scaled = [num * (denominator // d) for num, d in ratios]
    whole = sum(scaled)
    counts, remainders = [], []
    for w in scaled:
        count, remainder = divmod(size * w, whole)
        counts.append(count)
        remainders.append(remainder)
    for i in sorted(range(len(scaled)), key=lambda i: (-remainders[i], i))[: size - sum(counts)]:
        counts[i] += 1
    return counts


def mix_draws(counts: Sequence[int], aug_repeats: int, names: Sequence[str] | None = None) -> list[int]:
    """Each source's draws in an epoch of ``T0 = sum(counts)`` positions whose draws are ``k =
    aug_repeats`` positions each: the epoch's ``D = ceil(T0 / k)`` draws shared in proportion to the
    counts (:func:`batch_counts`).

    So ``d_s = c_s / k`` when ``k`` divides every count, ``d_s = c_s`` when ``k = 1``, and in any case
    ``d_s`` is within one of ``c_s * D / T0``. A source with no count gets no draw.

    Raises:
        ValueError: a source with a count gets no draw (its count is too small for ``k`` copies), naming
            it (by ``names[s]`` if given, else its number).

    Example:
        >>> mix_draws([6, 3, 2], 2)
        [3, 2, 1]
    """
    k = check_int("aug_repeats", aug_repeats, low=1)
    if k == 1:
        return list(counts)
    total = sum(counts)
    draws = -(-total // k)
    shares = batch_counts(draws, counts)
    starved = [s for s, (c, d) in enumerate(zip(counts, shares)) if c and not d]
    if starved:
        s = starved[0]
        name = repr(names[s]) if names is not None else str(s)
        raise ValueError(
            f"source {name} takes {counts[s]} of the epoch's {total} samples, too few for one draw of "
            f"aug_repeats={k} copies among the epoch's {draws} draws: raise its share or lower aug_repeats"
        )
    return shares


def mix_targets(sizes: Sequence[int], sources: Sequence[Source], counts: Sequence[int], epoch: int = 0) -> list[float]:
    """What each source's rule in force at ``epoch`` asks an epoch to take, before rounding:
    ``repeat * N_s``, ``choose``, or the weighted share of what the fixed counts leave of ``T0 = sum(counts)``.

    Examples:
        >>> mix_targets([100, 10, 50], [Source("a", weight=1), Source("b", repeat=2.5), Source("c", weight=2)],
        ...             [25, 25, 50])
        [25.0, 25.0, 50.0]
    """
    total = sum(counts)
    fixed = sum(c for c, s in zip(counts, sources) if s.kind != "weight")
    weights = sum(s.value_at(epoch) for s in sources if s.kind == "weight")
    targets = []
    for n, source in zip(sizes, sources):
        value = source.value_at(epoch)
        if source.kind == "weight":
            targets.append((total - fixed) * value / weights)
        elif source.kind == "choose":
            targets.append(float(value))
        else:
            targets.append(value * n)
    return targets


def mix_schedule(
    sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None
) -> tuple[list[int], int, tuple[tuple[int, tuple[int, ...]], ...]]:
    """The counts of epoch 0, the epoch size ``T0``, and each later change of the counts that the
    sources' schedules make: ``((first_epoch, counts), ...)``, ascending, each different from the
    counts before it. O(changes x sources).

    Raises:
        ValueError: as :func:`mix_counts` at any epoch a schedule changes, or a change of ``T0`` (an
            epoch keeps its size: set ``epoch_size`` and give a source a weight to take up the change).

    Example:
        >>> mix_schedule([100, 50], [Source("a", weight=1), Source("b", choose={0: 10, 5: 40})], 100)
        ([90, 10], 100, ((5, (60, 40)),))
    """
    counts, total = mix_counts(sizes, sources, epoch_size)
    changes: list[tuple[int, tuple[int, ...]]] = []
    last = tuple(counts)
    for epoch in sorted({e for source in sources for e in source.changes}):
        now, size = mix_counts(sizes, sources, epoch_size, epoch)
        if size != total:
            moved = next(s.name for s in sources if epoch in s.changes)
            raise ValueError(
                f"the schedule of source {moved!r} changes the epoch size from {total} to {size} at epoch {epoch}: "
                "an epoch keeps its size; set reload_cfg['epoch_size'] and give a source a weight to fill it"
            )
        if tuple(now) != last:
            last = tuple(now)
            changes.append((epoch, last))
    return counts, total, tuple(changes)
