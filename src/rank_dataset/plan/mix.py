"""Weighted mixing of several sources into one epoch order. Pure: numpy only, no I/O, no torch.

A mix of sources ``s = 0..S-1`` with ``N_s`` samples each takes ``c_s`` samples of source ``s`` per
epoch (:func:`mix_counts`), ``T0 = sum(c_s)`` in all. Sample ``k`` of source ``s`` has the global
number ``sum(N_0..N_{s-1}) + k``.

Which samples an epoch takes: each source is an endless stream whose pass ``j`` is the permutation
of its samples fixed by ``(seed, s, j)``; epoch ``e`` takes stream positions ``[e*c_s, (e+1)*c_s)``.
So a source never repeats a sample before all of its samples have been used, and from epoch 0 up to
any epoch each sample has been taken ``floor`` or ``ceil`` of ``epochs * c_s / N_s`` times. (Within
one epoch that does not start or end on a pass boundary a sample may be taken once more or once less
than that: the tail of one pass and the head of the next are drawn independently.)

Schedules: a source's rule may change from given epochs on (:class:`Source`); the counts of each
epoch are then those of the rules in force (:attr:`MixPlan.changes`), ``T0`` stays fixed, and epoch
``e`` takes stream positions from the sum of the source's counts in the epochs before ``e`` on
(:meth:`MixPlan.stream_starts`), so both guarantees above hold across changes.

The epoch order: slots ``[0, T0)`` belong to the sources in list order (``c_0`` slots, then ``c_1``,
...), and position ``p`` of the order holds slot ``permute(T0, seed, epoch, p mod T0)``, which
interleaves the sources. The shard layout (``R``, padding by wrapping, mini-epochs, ranks) is the
plain one of :mod:`rank_dataset.plan.spec` over ``T0`` positions. Everything costs O(positions asked for).

Repeated augmentation (``aug_repeats = k``): position ``p`` holds draw ``p // k``; the epoch's
``D = ceil(T0 / k)`` draws are shared among the sources by their counts (:func:`mix_draws`), the
``(seed, epoch)`` permutation of ``[0, D)`` interleaves them, and each stream advances by its draws.
With ``k = 1`` that is the order above.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import MAX_EXACT, check_int, check_ints
from rank_dataset.core.parsers import Parser, resolve_parser
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.exclude import Exclusion
from rank_dataset.plan.permutation import (
    _splitmix64,
    _splitmix64_array,
    grid_each,
    permute,
    permute_keyed,
    permute_stream,
    round_keys_each,
)
from rank_dataset.plan.subsets import SampleIds

__all__ = [
    "MixPlan",
    "Mixture",
    "Source",
    "SourceInfo",
    "as_sources",
    "combine_fingerprints",
    "mix_counts",
    "mix_draws",
    "mix_schedule",
    "mix_targets",
]

_MASK64 = (1 << 64) - 1
_FEW_SOURCES = 16  # up to this many sources, evaluate each one's permutation by a call of its own
_BLOCK = 1 << 16  # positions located at a time in a mix of many sources: the temporaries stay in cache

PathArg = str | os.PathLike[str]


def _positive_float(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _fspath(i: int, path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"paths[{i}] must be a str or os.PathLike, got {path!r} ({type(path).__name__})")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"paths[{i}] must be a str path, got bytes {text!r}")
    if not text:
        raise ValueError(f"paths[{i}] is an empty path")
    return text


Rule = float | Mapping[int, float]  # a value, or a schedule {first_epoch: value}


def _rule(name: str, value: Any, check: Callable[[str, Any], Any]) -> Any:
    """``value`` checked by ``check``; a schedule ``{first_epoch: value}`` checked entry by entry and
    sorted by epoch (a schedule of epoch 0 alone is its value)."""
    if not isinstance(value, Mapping):
        return check(name, value)
    rules = {}
    for epoch, v in value.items():
        first = check_int(f"{name} schedule epoch", epoch, low=0)
        rules[first] = check(f"{name}[{first}]", v)
    if 0 not in rules:
        raise ValueError(
            f"a {name} schedule must hold epoch 0 (the rule from the start), got the epochs {sorted(rules)}"
        )
    return rules[0] if len(rules) == 1 else dict(sorted(rules.items()))


def _in_force(rule: Any, epoch: int) -> Any:
    """The value of ``rule`` (a value or a sorted schedule) in force at ``epoch``."""
    if not isinstance(rule, Mapping):
        return rule
    return rule[max(e for e in rule if e <= epoch)]


@dataclass(frozen=True, init=False)
class Source:
    """One source of a mix: one meta file, or a list of them taken as one source, or the listed samples
    of them, and how much of it an epoch takes. It does not open the meta files.

    Args:
        paths: a path, or a non-empty list of paths (taken as one source, in order). Stored as a
            tuple of str.
        ids: None (every sample of the files), or the samples of the source: 0-based sample numbers
            over its files taken as one, as a 1-D integer array or the path of a ``.npy`` file (which
            is memory-mapped, as is a view of a memory-mapped array such as a value of
            :func:`~rank_dataset.files.grouping.group_by`: ranks and workers then read only the ids at
            their positions). The listed order is the order in eval mode. Stored as a
            ``SampleIds``; checked (distinct, in range) when a dataset opens the files.
        exclude: None, or sample numbers (in the numbering of ``ids``: over its files taken as one) to
            leave out of the source, the complement of ``ids``: a 1-D integer array, a list, or the
            path of a ``.npy`` file. With ``ids``, the listed ids that it names are left out. Stored
            sorted as an :class:`~rank_dataset.plan.exclude.Exclusion` (8 bytes a number; what is
            kept is never materialised); checked (in range, something left) when a dataset opens the files.
        weight: share of what the fixed-count sources leave of the epoch, in proportion to the
            other weights; a finite float > 0.
        repeat: the epoch takes ``round(repeat * N)`` samples (``N``: the source's size); a finite
            float > 0, may be < 1.
        choose: the epoch takes exactly ``choose`` samples; an int >= 1 (may exceed ``N``).
        parser: None (the dataset's parser), ``"json"``, ``"label"`` or a callable, for this
            source's items.
        name: for messages; defaults to the first path's file name (the whole path if it has none).

    At most one of ``weight``, ``repeat`` and ``choose``; none means ``repeat=1.0``. Each may be a
    schedule, a dict ``{first_epoch: value}`` holding epoch 0: the value in force from that epoch on
    (stored sorted by epoch; ``{0: v}`` alone is ``v``).

    Examples:
        >>> Source("data/a.txt", weight=2)  # doctest: +ELLIPSIS
        Source(paths=('data/a.txt',), weight=2.0, repeat=None, choose=None, parser=None, name='a.txt', ids=None, ...)
        >>> Source(["x/b1.txt", "x/b2.txt"]).repeat
        1.0
        >>> late = Source("c.txt", weight={10: 3, 0: 1})
        >>> late.weight, late.changes, late.at(12).weight
        ({0: 1.0, 10: 3.0}, (10,), 3.0)
        >>> Source("data/a.txt", ids=[5, 2, 9], name="a few").ids
        SampleIds(n=3)
    """

    paths: tuple[str, ...]
    weight: float | dict[int, float] | None
    repeat: float | dict[int, float] | None
    choose: int | dict[int, int] | None
    parser: str | Parser | None
    name: str
    ids: SampleIds | None
    exclude: Exclusion | None = None

    def __hash__(self) -> int:  # a schedule is a dict: hash its items
        def frozen(rule: Any) -> Any:
            return tuple(rule.items()) if isinstance(rule, Mapping) else rule

        return hash(
            (
                self.paths,
                *map(frozen, (self.weight, self.repeat, self.choose)),
                self.parser,
                self.name,
                self.ids,
                self.exclude,
            )
        )

    def __init__(
        self,
        paths: PathArg | Sequence[PathArg],
        *,
        ids: Any = None,
        exclude: Any = None,
        weight: Rule | None = None,
        repeat: Rule | None = None,
        choose: int | Mapping[int, int] | None = None,
        parser: str | Parser | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(paths, (str, os.PathLike)):
            normal: tuple[str, ...] = (_fspath(0, paths),)
        elif isinstance(paths, Sequence) and not isinstance(paths, (bytes, bytearray)):
            normal = tuple(_fspath(i, p) for i, p in enumerate(paths))
            if not normal:
                raise ValueError("paths must be a path or a non-empty list of paths, got an empty list")
        else:
            raise TypeError(f"paths must be a path or a list of paths, got {paths!r} ({type(paths).__name__})")
        given = [k for k, v in (("weight", weight), ("repeat", repeat), ("choose", choose)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of weight, repeat and choose, got {' and '.join(given)}")
        if weight is not None:
            weight = _rule("weight", weight, _positive_float)
        elif choose is not None:
            choose = _rule("choose", choose, lambda label, v: check_int(label, v, low=1))
        else:
            repeat = 1.0 if repeat is None else _rule("repeat", repeat, _positive_float)
        resolve_parser(parser)  # raises on anything but None, "json", "label" or a callable
        if name is None:
            name = os.path.basename(normal[0]) or normal[0]
        elif not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r} ({type(name).__name__})")
        elif not name:
            raise ValueError("name must not be empty")
        for field, value in [("paths", normal), ("weight", weight), ("repeat", repeat), ("choose", choose)]:
            object.__setattr__(self, field, value)
        object.__setattr__(self, "parser", parser)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "ids", None if ids is None else SampleIds.of(ids, name))
        object.__setattr__(self, "exclude", None if exclude is None else Exclusion.of(exclude, f"source {name!r}"))

    @property
    def kind(self) -> str:
        """Which rule the source has: ``"weight"``, ``"repeat"`` or ``"choose"``."""
        return "weight" if self.weight is not None else "choose" if self.choose is not None else "repeat"

    @property
    def changes(self) -> tuple[int, ...]:
        """The epochs after 0 at which the source's rule changes (empty without a schedule)."""
        rule = getattr(self, self.kind)
        return tuple(e for e in rule if e) if isinstance(rule, Mapping) else ()

    def value_at(self, epoch: int) -> float:
        """The value of the source's rule in force at ``epoch`` (an int for ``choose``)."""
        value: float = _in_force(getattr(self, self.kind), epoch)
        return value

    def at(self, epoch: int) -> Source:
        """This source with the rule in force at ``epoch`` and no schedule (itself if it has none)."""
        if not self.changes:
            return self
        value = self.value_at(epoch)
        # The same source (its subset too, not checked again) with the value in force as its rule.
        source = copy.copy(self)
        object.__setattr__(source, self.kind, int(value) if self.kind == "choose" else value)
        return source

    def describe(self, epoch: int = 0) -> str:
        """The rule in force at ``epoch``, e.g. ``"weight=2"``, ``"choose=1,000"``."""
        value = self.value_at(epoch)
        return f"choose={int(value):,}" if self.kind == "choose" else f"{self.kind}={value:g}"


def mix_counts(
    sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None, epoch: int = 0
) -> tuple[list[int], int]:
    """Per-epoch counts ``c_s`` of each source and the epoch size ``T0 = sum(c_s)``, by the rules in
    force at ``epoch`` (see :meth:`Source.at`).

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
    weighted, ratios = [], []
    for i, (source, n, name) in enumerate(zip(sources, ns, names)):
        value = source.value_at(epoch)
        if source.kind == "weight":
            weighted.append(i)
            ratios.append(float(value).as_integer_ratio())
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
    # Exact rationals as integers: each weight (a float, so a dyadic fraction) times the common
    # denominator; quota_i = left * w_i / whole, its floor and remainder by one integer division.
    denominator = max(d for _, d in ratios)
    scaled = [num * (denominator // d) for num, d in ratios]
    whole = sum(scaled)
    remainders = {}
    for i, w in zip(weighted, scaled):
        counts[i], remainders[i] = divmod(left * w, whole)
    by_remainder = sorted(weighted, key=lambda i: (-remainders[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    zero = [names[i] for i in weighted if counts[i] == 0]
    if zero:
        raise ValueError(
            f"the weighted share of source(s) {', '.join(zero)} rounds to 0 of the {left} samples that the fixed "
            f"counts leave of {why}: raise their weight or the epoch size"
        )
    return counts, total


def mix_draws(counts: Sequence[int], aug_repeats: int, names: Sequence[str] | None = None) -> list[int]:
    """Each source's draws in an epoch of ``T0 = sum(counts)`` positions whose draws are ``k =
    aug_repeats`` positions each: the epoch's ``D = ceil(T0 / k)`` draws shared in proportion to the
    counts by largest remainder (exact rational arithmetic; equal remainders favour the earlier source).

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
    quotas = [Fraction(c * draws, total) for c in counts]
    shares = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(counts)), key=lambda s: (-(quotas[s] - shares[s]), s))
    for s in by_remainder[: draws - sum(shares)]:
        shares[s] += 1
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


def combine_fingerprints(fingerprints: Sequence[str]) -> str:
    """One fingerprint for several files taken as one source: the file's own for one file, else a
    hash of theirs (so a client that knows each served file's fingerprint can compute it).

    Examples:
        >>> combine_fingerprints(["abc"])
        'abc'
        >>> len(combine_fingerprints(["abc", "def"]))
        32
    """
    if len(fingerprints) == 1:
        return fingerprints[0]
    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SourceInfo:
    """One source of a dataset's mix, with its numbers in the current epoch (what ``ds.sources`` lists).

    Args:
        source: the Source as given.
        num_samples: ``N_s``, the samples of its files.
        count: ``c_s``, the samples the current epoch takes of it (in eval mode: ``N_s``, every sample once).
        offset: the global number of its first sample (``sum(N_0..N_{s-1})``).
        target: what its rule in force asks an epoch to take before rounding (see :func:`mix_targets`).
        fingerprint: the hash of its files (see :func:`combine_fingerprints`).
        taken: the samples drawn from its stream from epoch 0 through the current epoch (with
            repeated augmentation, draws: each is read ``aug_repeats`` times); in eval mode ``N_s``.
    """

    source: Source
    num_samples: int
    count: int
    offset: int
    target: float
    fingerprint: str
    taken: int = 0

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    @property
    def passes(self) -> float:
        """``c_s / N_s``: how many times an epoch goes through the source (< 1: a part of it)."""
        return self.count / self.num_samples

    @property
    def passes_completed(self) -> int:
        """Whole passes through the source from epoch 0 through the current epoch: ``taken // N_s``."""
        return self.taken // self.num_samples

    @property
    def epochs_seen(self) -> float:
        """``taken / N_s``: how many times the source has been gone through, as a fraction."""
        return self.taken / self.num_samples


def _source_seed(seed: int, source: int) -> int:
    """The key of source ``source``'s stream, derived from the mix's ``seed``."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ _splitmix64((source + 0x5EED) & _MASK64))


def _source_seeds(seed: int, count: int) -> npt.NDArray[np.uint64]:
    """:func:`_source_seed` of sources ``0..count-1``, in numpy."""
    sources = np.arange(0x5EED, 0x5EED + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _splitmix64_array(np.uint64(_splitmix64(seed & _MASK64)) ^ _splitmix64_array(sources))


@dataclass(frozen=True, repr=False)
class MixPlan:
    """The numbers that fix a mix's epoch order (with a seed and an epoch); validated, hashable.

    Args:
        sizes: ``N_s``, the samples of each source (each >= 1).
        counts: ``c_s``, the samples each epoch takes of each source (each >= 1), from epoch 0 on.
        epoch_size: ``T0``, which must be ``sum(counts)``, at most 2**62.
        changes: the counts the sources' schedules set from later epochs on: ``((first_epoch,
            counts), ...)``, epochs ascending and > 0, each counts summing to ``T0`` (empty: none).

    Each source is a stream (see :func:`~rank_dataset.plan.permutation.permute_stream`) that each epoch
    advances by its draws (its count, without repeated augmentation): its stream position at epoch
    ``e`` is the sum of its draws in the epochs before (:meth:`stream_starts`).

    Examples:
        >>> plan = MixPlan.from_sources([3, 5], [Source("a", repeat=2), Source("b", choose=2)])
        >>> plan
        MixPlan(sizes=(3, 5), counts=(6, 2), epoch_size=8)
        >>> samples, ids = plan.locate(seed=0, epoch=0, positions=range(8))
        >>> sorted(ids.tolist()), sorted(samples[ids == 0].tolist())
        ([0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2])
        >>> MixPlan.from_dict(plan.to_dict()) == plan
        True
        >>> later = MixPlan((3, 5), (6, 2), 8, changes=((4, (4, 4)),))
        >>> later.counts_at(3), later.counts_at(9), later.stream_starts(6)
        ((6, 2), (4, 4), (32, 16))
    """

    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    epoch_size: int
    changes: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __repr__(self) -> str:
        later = f", changes={self.changes}" if self.changes else ""
        return f"MixPlan(sizes={self.sizes}, counts={self.counts}, epoch_size={self.epoch_size}{later})"

    def __post_init__(self) -> None:
        for field in ("sizes", "counts"):
            values = getattr(self, field)
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TypeError(f"{field} must be a sequence of ints, got {values!r}")
            checked = check_ints(field, values, low=1)
            object.__setattr__(self, field, checked)
        if not self.sizes or len(self.sizes) != len(self.counts):
            raise ValueError(f"sizes and counts must be non-empty and equally long, got {self.sizes} and {self.counts}")
        total = check_int("epoch_size", self.epoch_size, low=1)
        if total != sum(self.counts):
            raise ValueError(f"epoch_size must be sum(counts) = {sum(self.counts)}, got {total}")
        if total > MAX_EXACT or sum(self.sizes) > MAX_EXACT:
            raise ValueError("the epoch size and the total number of samples must be at most 2**62")
        object.__setattr__(self, "epoch_size", total)
        if isinstance(self.changes, (str, bytes)) or not isinstance(self.changes, Sequence):
            raise TypeError(f"changes must be a sequence of (first_epoch, counts), got {self.changes!r}")
        changes, last = [], 0
        for i, change in enumerate(self.changes):
            if isinstance(change, (str, bytes)) or not isinstance(change, Sequence) or len(change) != 2:
                raise TypeError(f"changes[{i}] must be a pair (first_epoch, counts), got {change!r}")
            first = check_int(f"changes[{i}] first epoch", change[0], low=last + 1)
            counts = change[1]
            if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
                raise TypeError(f"changes[{i}] counts must be a sequence of ints, got {counts!r}")
            checked = tuple(check_int(f"changes[{i}] counts[{j}]", c, low=1) for j, c in enumerate(counts))
            if len(checked) != len(self.sizes) or sum(checked) != total:
                raise ValueError(
                    f"changes[{i}] counts must be {len(self.sizes)} counts summing to epoch_size={total} (an epoch "
                    f"keeps its size), got {checked}"
                )
            changes.append((first, checked))
            last = first
        object.__setattr__(self, "changes", tuple(changes))

    @classmethod
    def from_sources(cls, sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None) -> MixPlan:
        """The plan of ``sources`` with ``sizes`` samples each, schedules included (see :func:`mix_schedule`)."""
        counts, total, changes = mix_schedule(sizes, sources, epoch_size)
        return cls(tuple(sizes), tuple(counts), total, changes)

    @classmethod
    def every_sample(cls, sizes: Sequence[int]) -> MixPlan:
        """The plan that takes every sample of every source once (what eval mode reads)."""
        return cls(tuple(sizes), tuple(sizes), sum(sizes))

    @property
    def num_samples(self) -> int:
        """``sum(N_s)``: the global sample numbers are ``[0, num_samples)``."""
        return sum(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The global number of each source's first sample."""
        return tuple(Bounds(self.sizes).starts[:-1].tolist())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` makes the same plan of it (``changes`` only if any)."""
        data: dict[str, Any] = {"sizes": list(self.sizes), "counts": list(self.counts), "epoch_size": self.epoch_size}
        if self.changes:
            data["changes"] = [[first, list(counts)] for first, counts in self.changes]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MixPlan:
        """The plan that :meth:`to_dict` described; ValueError if keys are missing or unknown."""
        keys = {"sizes", "counts", "epoch_size"}
        if not isinstance(data, Mapping) or not keys <= set(data) <= keys | {"changes"}:
            raise ValueError(f"a MixPlan dict has exactly the keys {sorted(keys)} (and changes), got {data!r}")
        changes = data.get("changes", ())
        if isinstance(changes, (str, bytes)) or not isinstance(changes, Sequence):
            raise TypeError(f"changes must be a list of [first_epoch, counts], got {changes!r}")
        pairs = tuple((c[0], tuple(c[1])) if isinstance(c, Sequence) and len(c) == 2 else c for c in changes)
        return cls(tuple(data["sizes"]), tuple(data["counts"]), data["epoch_size"], pairs)

    def counts_at(self, epoch: int) -> tuple[int, ...]:
        """The counts in force at ``epoch``."""
        counts = self.counts
        for first, later in self.changes:
            if first > epoch:
                break
            counts = later
        return counts

    def stream_starts(self, epoch: int, aug_repeats: int = 1) -> tuple[int, ...]:
        """Each source's stream position at the start of ``epoch``: the sum of its draws (its counts,
        with ``aug_repeats=1``) in epochs ``0..epoch-1``. O(changes x sources), exact Python ints."""
        epoch = check_int("epoch", epoch, low=0)
        starts = [0] * len(self.sizes)
        bounds = [(0, self.counts), *self.changes]
        for (first, counts), (stop, _) in zip(bounds, [*bounds[1:], (epoch, ())]):
            span = min(stop, epoch) - first
            if span <= 0:
                break
            for s, d in enumerate(mix_draws(counts, aug_repeats)):
                starts[s] += span * d
        return tuple(starts)

    def check_draws(self, aug_repeats: int) -> None:
        """Raise ValueError if a source's count, in any epoch, is too small for one draw of ``aug_repeats``."""
        for counts in (self.counts, *(c for _, c in self.changes)):
            mix_draws(counts, aug_repeats)

    def source_of(self, samples: npt.ArrayLike, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[np.integer[Any]]:
        """The source of each global sample number (the source ``s`` with ``offset_s <= sample < offset_{s+1}``),
        as ``dtype`` (int64 by default; any integer dtype that holds the source numbers)."""
        return Bounds(self.sizes).part_of(samples, dtype)

    def draws(self, aug_repeats: int = 1, epoch: int = 0) -> tuple[int, ...]:
        """Each source's draws in ``epoch`` when draws are ``aug_repeats`` positions each (see :func:`mix_draws`)."""
        return tuple(mix_draws(self.counts_at(epoch), aug_repeats))

    def locate(
        self, seed: int, epoch: int, positions: npt.ArrayLike, aug_repeats: int = 1
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The global sample numbers and source ids at ``positions`` of the epoch order.

        Args:
            seed: any int; with ``epoch`` it fixes the order.
            epoch: an int >= 0.
            positions: ints >= 0, any shape; a position ``p >= T0`` is padding and holds what ``p mod T0``
                holds (as in :func:`rank_dataset.plan.spec.epoch_order`).
            aug_repeats: ``k``, the positions of a draw: position ``p`` holds draw ``p // k`` (1: every
                position is a draw of its own, the order of a mix without repeated augmentation).

        Returns:
            ``(samples, source_ids)``: two int64 arrays of the shape of ``positions``.
        """
        check_int("seed", seed)
        check_int("epoch", epoch, low=0)
        draws = self.draws(aug_repeats, epoch)
        bases = self.stream_starts(epoch, aug_repeats)
        pos = np.asarray(positions)
        if pos.size and not np.issubdtype(pos.dtype, np.integer):
            raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
        flat = pos.astype(np.int64).reshape(-1)
        if flat.size and int(flat.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(flat.min())}")
        if flat.size and int(flat.max()) >= self.epoch_size:
            flat %= self.epoch_size
        if aug_repeats > 1:
            flat //= aug_repeats
        # Draw slots [0, D) belong to the sources in order (d_0 of source 0, ...); the (seed, epoch)
        # permutation of the D slots interleaves them.
        slots = permute(sum(draws), seed, epoch, flat)
        slot_bounds = Bounds(draws)
        starts = slot_bounds.starts
        ids = slot_bounds.part_of(slots)
        if len(self.sizes) > _FEW_SOURCES:
            return self._locate_many(seed, bases, slots, ids, starts).reshape(pos.shape), ids.reshape(pos.shape)
        samples = np.empty_like(slots)
        offset = 0
        for s, n in enumerate(self.sizes):
            where = np.flatnonzero(ids == s) if len(self.sizes) > 1 else slice(None)
            # Slot j of source s is its stream position bases[s] + j.
            t = slots[where]
            t -= int(starts[s])
            samples[where] = permute_stream(n, _source_seed(seed, s), bases[s], t, stop=draws[s]) + offset
            offset += n
        return samples.reshape(pos.shape), ids.reshape(pos.shape)

    def _locate_many(
        self,
        seed: int,
        bases: Sequence[int],
        slots: npt.NDArray[np.int64],
        ids: npt.NDArray[np.int64],
        starts: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """:meth:`locate`'s samples for a mix of many sources: the same numbers, every source's
        permutations evaluated together (:func:`~rank_dataset.plan.permutation.permute_keyed`) rather than
        a call per source and pass, which would cost a mix of thousands of sources seconds. The grid
        and round keys are computed once per source and pass, a block of positions at a time."""
        sizes = np.asarray(self.sizes, np.int64)
        heads = [divmod(int(b), n) for n, b in zip(self.sizes, bases)]  # each source's stream start
        first_pass = np.array([f for f, _ in heads], np.int64)
        head = np.array([h for _, h in heads], np.int64)
        seeds = _source_seeds(seed, len(self.sizes))
        rows, col_bits = grid_each(sizes)
        offsets = np.concatenate(([0], np.cumsum(sizes[:-1])))
        # Slot j of source s is pass (head + j) // n of its stream, after its first pass: at most
        # `span` passes a source in this epoch. The round keys of each (source, pass) are computed
        # once, not once a position: all of them in one table where that is small, else those met.
        span = int(((np.diff(starts) - 1 + head) // sizes).max()) + 1
        table = None
        if sizes.size * span <= max(slots.size, 1 << 16):
            pair = np.arange(sizes.size * span, dtype=np.int64)
            table = round_keys_each(np.repeat(seeds, span), np.repeat(first_pass, span) + pair % span)
        shift = starts[:-1] - head  # slot j of source s is stream position j - shift[s] from its first pass
        out = np.empty_like(slots)
        for a in range(0, slots.size, _BLOCK):
            src = ids[a : a + _BLOCK]
            n = sizes[src]
            k = slots[a : a + _BLOCK] - shift[src]
            if span == 1:
                rel = None
            elif span == 2:  # one pass boundary at most: a comparison, not a division
                rel = (k >= n).view(np.int8)
                k -= n * rel
            else:
                rel, k = np.divmod(k, n)
            code = src * span if rel is None else src * span + rel
            if table is not None:
                pair_keys = [g[code] for g in table]
            else:
                pairs, which = np.unique(code, return_inverse=True)
                keys = round_keys_each(seeds[pairs // span], first_pass[pairs // span] + pairs % span)
                pair_keys = [g[which] for g in keys]
            out[a : a + _BLOCK] = permute_keyed(n, rows[src], col_bits[src], pair_keys, k)
            out[a : a + _BLOCK] += offsets[src]
        return out

    def epoch_order(
        self, seed: int, epoch: int, positions: npt.ArrayLike, aug_repeats: int = 1
    ) -> npt.NDArray[np.int64]:
        """The global sample numbers at ``positions`` (see :meth:`locate`); in the mix, this takes the
        place of ``rank_dataset.plan.spec.epoch_order(T0, seed, epoch, positions, aug_repeats)``."""
        return self.locate(seed, epoch, positions, aug_repeats)[0]


def as_sources(value: Any) -> tuple[Source, ...] | None:
    """``value`` as a tuple of Sources if it is a Source or a list of them; None if it holds none.

    Raises:
        TypeError: a list that holds Sources and other things.
    """
    if isinstance(value, Source):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        kinds = [isinstance(v, Source) for v in value]
        if all(kinds):
            return tuple(value)
        if any(kinds):
            bad = next(v for v, k in zip(value, kinds) if not k)
            raise TypeError(f"a list of sources must hold only Source objects, got {bad!r}: wrap each path in a Source")
    return None


def _source_id_dtype(count: int) -> np.dtype[Any]:
    """The smallest signed dtype holding source numbers ``[0, count)``."""
    for dtype in (np.int8, np.int16, np.int32):
        if count <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)  # pragma: no cover - more than 2**31 sources


class Mixture:
    """A dataset's mix: its sources, their sizes and fingerprints, its :class:`MixPlan`, and the
    parser of each source.

    Args:
        sources: the Sources, in order.
        sizes: ``N_s``, the samples of each source (its files', or its listed ids; each >= 1).
        fingerprints: gives the fingerprint of each source's files (see :func:`combine_fingerprints`);
            called once, when first needed.
        parser: the dataset's parser, for the sources that have none of their own.
        is_test: eval mode, which ignores weights: every sample of every source once, in order.
        epoch_size: ``T0`` (None: as :func:`mix_counts` decides).
        aug_repeats: the copies of each draw (see :func:`mix_draws`); train mode only.

    Raises:
        ValueError: a source with no samples (named), counts that cannot be met (in any epoch of the
            schedules), or a source whose count holds no draw of ``aug_repeats`` copies (named).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        sizes: Sequence[int],
        fingerprints: Callable[[], tuple[str, ...]],
        parser: Parser | None,
        is_test: bool,
        epoch_size: int | None,
        aug_repeats: int = 1,
    ) -> None:
        if len(sizes) != len(sources):
            raise ValueError(f"{len(sources)} sources need as many sizes, got {len(sizes)}")
        for i, (source, n) in enumerate(zip(sources, sizes)):
            if n == 0:
                raise ValueError(f"source {i} {source.name!r} has no samples: every line is empty or whitespace")
        self.sources = tuple(sources)
        self.is_test = is_test
        self.plan = MixPlan.every_sample(sizes) if is_test else MixPlan.from_sources(sizes, sources, epoch_size)
        if not is_test:  # a source too small for one draw of k copies, by its name, in any epoch
            for counts in (self.plan.counts, *(c for _, c in self.plan.changes)):
                mix_draws(counts, aug_repeats, [s.name for s in sources])
        self._fingerprints = fingerprints
        # None: every source parses with the dataset's parser (so items need not know their source).
        self.parsers: tuple[Parser | None, ...] | None = None
        if any(s.parser is not None for s in sources):
            own = [resolve_parser(s.parser) for s in sources]
            self.parsers = tuple(parser if p is None else p for p in own)
        self.source_dtype = _source_id_dtype(len(sources))

    @functools.cached_property
    def fingerprints(self) -> tuple[str, ...]:
        """The fingerprint of each source's files."""
        return self._fingerprints()

    @property
    def fingerprint(self) -> str:
        """One fingerprint of every source's files (what a resume state of the mix records)."""
        return combine_fingerprints(self.fingerprints)

    def infos(self, epoch: int = 0, aug_repeats: int = 1) -> tuple[SourceInfo, ...]:
        """Each source with its numbers in ``epoch`` (see :class:`SourceInfo`): its count and target by
        the rules in force, and what its stream has given from epoch 0 through ``epoch``."""
        mix = self.plan
        if self.is_test:
            counts, targets, taken = mix.sizes, list(map(float, mix.sizes)), mix.sizes
        else:
            counts = mix.counts_at(epoch)
            targets = mix_targets(mix.sizes, self.sources, counts, epoch)
            taken = mix.stream_starts(epoch + 1, aug_repeats)
        return tuple(
            SourceInfo(source, n, c, offset, target, fingerprint, t)
            for source, n, c, offset, target, fingerprint, t in zip(
                self.sources, mix.sizes, counts, mix.offsets, targets, self.fingerprints, taken
            )
        )

    def __getstate__(self) -> dict[str, Any]:
        # A worker needs no ids: those held in memory would be copied (those in a file are a reference).
        state = self.__dict__.copy()
        state["sources"] = tuple(_without_memory_ids(s) for s in self.sources)
        return state

    def source_ids(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.integer[Any]]:
        """The source number of each global sample number in ``indices``, as :attr:`source_dtype`."""
        return self.plan.source_of(indices, self.source_dtype)

    def parser(self, source: int) -> Parser | None:
        """The parser of source ``source`` (only when some source has its own: see :attr:`parsers`)."""
        assert self.parsers is not None
        return self.parsers[source]


def _without_memory_ids(source: Source) -> Source:
    """``source`` without its ids if they are held in memory, and without its exclusion; else ``source``."""
    memory_ids = source.ids is not None and not isinstance(source.ids.base, np.memmap)
    if not memory_ids and source.exclude is None:
        return source
    copy = object.__new__(Source)
    copy.__dict__.update(source.__dict__)
    if memory_ids:
        object.__setattr__(copy, "ids", None)
    object.__setattr__(copy, "exclude", None)
    return copy
