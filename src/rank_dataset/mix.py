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

The epoch order: slots ``[0, T0)`` belong to the sources in list order (``c_0`` slots, then ``c_1``,
...), and position ``p`` of the order holds slot ``permute(T0, seed, epoch, p mod T0)``, which
interleaves the sources. The shard layout (``R``, padding by wrapping, mini-epochs, ranks) is the
plain one of :mod:`rank_dataset.plan` over ``T0`` positions. Everything costs O(positions asked for).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset._checks import check_int
from rank_dataset.parsers import Parser, resolve_parser
from rank_dataset.permutation import _splitmix64, permute, permute_stream

__all__ = ["MixPlan", "Source", "SourceInfo", "combine_fingerprints", "mix_counts", "mix_draws", "mix_targets"]

_MAX = 1 << 62  # permute's largest n; also keeps every int64 sum below overflow
_MASK64 = (1 << 64) - 1
_FEW_BOUNDS = 16  # up to this many sources, find a value's source by comparisons, not a binary search

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


@dataclass(frozen=True, init=False)
class Source:
    """One source of a mix: one meta file, or a list of them taken as one source, and how much of it
    an epoch takes. Pure: it does not open the files.

    Args:
        paths: a path, or a non-empty list of paths (taken as one source, in order). Stored as a
            tuple of str.
        weight: share of what the fixed-count sources leave of the epoch, in proportion to the
            other weights; a finite float > 0.
        repeat: the epoch takes ``round(repeat * N)`` samples (``N``: the source's size); a finite
            float > 0, may be < 1.
        choose: the epoch takes exactly ``choose`` samples; an int >= 1 (may exceed ``N``).
        parser: None (the dataset's parser), ``"json"``, ``"label"`` or a callable, for this
            source's items.
        name: for messages; defaults to the first path's file name (the whole path if it has none).

    At most one of ``weight``, ``repeat`` and ``choose``; none means ``repeat=1.0``.

    Example:
        >>> Source("data/a.txt", weight=2)
        Source(paths=('data/a.txt',), weight=2.0, repeat=None, choose=None, parser=None, name='a.txt')
        >>> Source(["x/b1.txt", "x/b2.txt"]).repeat
        1.0
    """

    paths: tuple[str, ...]
    weight: float | None
    repeat: float | None
    choose: int | None
    parser: str | Parser | None
    name: str

    def __init__(
        self,
        paths: PathArg | Sequence[PathArg],
        *,
        weight: float | None = None,
        repeat: float | None = None,
        choose: int | None = None,
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
            weight = _positive_float("weight", weight)
        elif choose is not None:
            choose = check_int("choose", choose, low=1)
        else:
            repeat = 1.0 if repeat is None else _positive_float("repeat", repeat)
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


def mix_counts(sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None) -> tuple[list[int], int]:
    """Per-epoch counts ``c_s`` of each source and the epoch size ``T0 = sum(c_s)``.

    ``repeat=r`` takes ``round(r * N_s)`` (Python's round: halves to even), ``choose=k`` takes ``k``,
    and the weighted sources share what is left of ``T0`` in proportion to their weights, by largest
    remainder (exact rational arithmetic; equal remainders favour the earlier source). ``T0`` is
    ``epoch_size`` if given, else the sum of the fixed counts when no source has a weight, else the
    total number of samples of all sources.

    Args:
        sizes: ``N_s``, the number of samples of each source (each >= 1), in the order of ``sources``.
        sources: the sources; at least one.
        epoch_size: ``T0``, an int >= 1, or None for the default above.

    Raises:
        ValueError: naming the source, if a source is empty, a repeat rounds to 0, the fixed counts
            exceed ``T0``, a weighted share rounds to 0, or, without weighted sources, the fixed
            counts do not add up to ``epoch_size``.

    Example:
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
    names = []
    for i, source in enumerate(sources):
        if not isinstance(source, Source):
            raise TypeError(f"sources[{i}] must be a Source, got {source!r} ({type(source).__name__})")
        names.append(repr(source.name))
    ns = [check_int(f"size of source {name}", n, low=1) for name, n in zip(names, sizes)]
    counts: list[int] = [0] * len(sources)
    weighted = []
    for i, (source, n, name) in enumerate(zip(sources, ns, names)):
        if source.weight is not None:
            weighted.append(i)
        elif source.choose is not None:
            counts[i] = source.choose
        else:
            assert source.repeat is not None
            counts[i] = round(source.repeat * n)
            if counts[i] == 0:
                raise ValueError(f"source {name}: repeat={source.repeat} of its {n} samples rounds to 0 per epoch")
    fixed = sum(counts)
    if epoch_size is not None:
        total = check_int("epoch_size", epoch_size, low=1)
        why = f"epoch_size={total}"
    elif weighted:
        total, why = sum(ns), f"the epoch size, by default the total number of samples ({sum(ns)})"
    else:
        total, why = fixed, ""
    if not 1 <= total <= _MAX:
        raise ValueError(f"the epoch size must be in [1, 2**62], got {total}")
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
    weights = {i: Fraction(sources[i].weight or 0.0) for i in weighted}
    whole = sum(weights.values())
    quotas = {i: left * w / whole for i, w in weights.items()}
    for i, q in quotas.items():
        counts[i] = math.floor(q)
    by_remainder = sorted(weighted, key=lambda i: (-(quotas[i] - counts[i]), i))
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


def mix_targets(sizes: Sequence[int], sources: Sequence[Source], counts: Sequence[int]) -> list[float]:
    """What each source's rule asks an epoch to take, before rounding: ``repeat * N_s``, ``choose``,
    or the weighted share of what the fixed counts leave of ``T0 = sum(counts)``.

    Example:
        >>> mix_targets([100, 10, 50], [Source("a", weight=1), Source("b", repeat=2.5), Source("c", weight=2)],
        ...             [25, 25, 50])
        [25.0, 25.0, 50.0]
    """
    total = sum(counts)
    fixed = sum(c for c, s in zip(counts, sources) if s.weight is None)
    weights = sum(s.weight for s in sources if s.weight is not None)
    targets = []
    for n, source in zip(sizes, sources):
        if source.weight is not None:
            targets.append((total - fixed) * source.weight / weights)
        elif source.choose is not None:
            targets.append(float(source.choose))
        else:
            assert source.repeat is not None
            targets.append(source.repeat * n)
    return targets


def combine_fingerprints(fingerprints: Sequence[str]) -> str:
    """One fingerprint for several files taken as one source: the file's own for one file, else a
    hash of theirs (so a client that knows each served file's fingerprint can compute it).

    Example:
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
    """One source of a dataset's mix, with its numbers (what ``ds.sources`` lists).

    Args:
        source: the Source as given.
        num_samples: ``N_s``, the samples of its files.
        count: ``c_s``, the samples an epoch takes of it (in eval mode: ``N_s``, every sample once).
        offset: the global number of its first sample (``sum(N_0..N_{s-1})``).
        target: what its rule asks an epoch to take before rounding (see :func:`mix_targets`).
        fingerprint: the hash of its files (see :func:`combine_fingerprints`).
    """

    source: Source
    num_samples: int
    count: int
    offset: int
    target: float
    fingerprint: str

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    @property
    def passes(self) -> float:
        """``c_s / N_s``: how many times an epoch goes through the source (< 1: a part of it)."""
        return self.count / self.num_samples


def _bucket(values: npt.NDArray[np.int64], bounds: npt.NDArray[np.int64], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """For each value, how many of the ascending ``bounds`` are <= it, as ``dtype``."""
    if bounds.size > _FEW_BOUNDS:
        return np.searchsorted(bounds, values, side="right").astype(dtype, copy=False)
    out = np.zeros(values.shape, dtype)
    for bound in bounds.tolist():
        out += values >= bound
    return out


def _source_seed(seed: int, source: int) -> int:
    """The key of source ``source``'s stream, derived from the mix's ``seed``."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ _splitmix64((source + 0x5EED) & _MASK64))


@dataclass(frozen=True)
class MixPlan:
    """The numbers that fix a mix's epoch order (with a seed and an epoch); validated, hashable.

    Args:
        sizes: ``N_s``, the samples of each source (each >= 1).
        counts: ``c_s``, the samples each epoch takes of each source (each >= 1).
        epoch_size: ``T0``, which must be ``sum(counts)``, at most 2**62.

    Example:
        >>> plan = MixPlan.from_sources([3, 5], [Source("a", repeat=2), Source("b", choose=2)])
        >>> plan
        MixPlan(sizes=(3, 5), counts=(6, 2), epoch_size=8)
        >>> samples, ids = plan.locate(seed=0, epoch=0, positions=range(8))
        >>> sorted(ids.tolist()), sorted(samples[ids == 0].tolist())
        ([0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2])
        >>> MixPlan.from_dict(plan.to_dict()) == plan
        True
    """

    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    epoch_size: int

    def __post_init__(self) -> None:
        for field in ("sizes", "counts"):
            values = getattr(self, field)
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TypeError(f"{field} must be a sequence of ints, got {values!r}")
            checked = tuple(check_int(f"{field}[{i}]", v, low=1) for i, v in enumerate(values))
            object.__setattr__(self, field, checked)
        if not self.sizes or len(self.sizes) != len(self.counts):
            raise ValueError(f"sizes and counts must be non-empty and equally long, got {self.sizes} and {self.counts}")
        total = check_int("epoch_size", self.epoch_size, low=1)
        if total != sum(self.counts):
            raise ValueError(f"epoch_size must be sum(counts) = {sum(self.counts)}, got {total}")
        if total > _MAX or sum(self.sizes) > _MAX:
            raise ValueError("the epoch size and the total number of samples must be at most 2**62")
        object.__setattr__(self, "epoch_size", total)

    @classmethod
    def from_sources(cls, sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None = None) -> MixPlan:
        """The plan of ``sources`` with ``sizes`` samples each (see :func:`mix_counts`)."""
        counts, total = mix_counts(sizes, sources, epoch_size)
        return cls(tuple(sizes), tuple(counts), total)

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
        return tuple(int(x) for x in np.cumsum((0, *self.sizes[:-1])))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` makes the same plan of it."""
        return {"sizes": list(self.sizes), "counts": list(self.counts), "epoch_size": self.epoch_size}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MixPlan:
        """The plan that :meth:`to_dict` described; ValueError if keys are missing or unknown."""
        keys = {"sizes", "counts", "epoch_size"}
        if not isinstance(data, Mapping) or set(data) != keys:
            raise ValueError(f"a MixPlan dict has exactly the keys {sorted(keys)}, got {data!r}")
        return cls(tuple(data["sizes"]), tuple(data["counts"]), data["epoch_size"])

    def source_of(self, samples: npt.ArrayLike, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[np.integer[Any]]:
        """The source of each global sample number (the source ``s`` with ``offset_s <= sample < offset_{s+1}``),
        as ``dtype`` (int64 by default; any integer dtype that holds the source numbers)."""
        stops = np.cumsum(np.asarray(self.sizes, np.int64))
        return _bucket(np.asarray(samples, np.int64), stops[:-1], np.dtype(dtype))

    def draws(self, aug_repeats: int = 1) -> tuple[int, ...]:
        """Each source's draws in an epoch whose draws are ``aug_repeats`` positions each (see :func:`mix_draws`)."""
        return tuple(mix_draws(self.counts, aug_repeats))

    def locate(
        self, seed: int, epoch: int, positions: npt.ArrayLike, aug_repeats: int = 1
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The global sample numbers and source ids at ``positions`` of the epoch order.

        Args:
            seed: any int; with ``epoch`` it fixes the order.
            epoch: an int >= 0.
            positions: ints >= 0, any shape; a position ``p >= T0`` is padding and holds what ``p mod T0``
                holds (as in :func:`rank_dataset.plan.epoch_order`).
            aug_repeats: ``k``, the positions of a draw: position ``p`` holds draw ``p // k`` (1: every
                position is a draw of its own, the order of a mix without repeated augmentation).

        Returns:
            ``(samples, source_ids)``: two int64 arrays of the shape of ``positions``.
        """
        check_int("seed", seed)
        check_int("epoch", epoch, low=0)
        draws = self.draws(aug_repeats)
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
        starts = np.cumsum((0, *draws[:-1]), dtype=np.int64)
        ids = _bucket(slots, starts[1:], np.dtype(np.int64))
        samples = np.empty_like(slots)
        offset = 0
        for s, (n, d) in enumerate(zip(self.sizes, draws)):
            where = np.flatnonzero(ids == s) if len(self.sizes) > 1 else slice(None)
            # Slot j of source s is its stream position epoch * d + j.
            t = slots[where]
            t -= int(starts[s])
            samples[where] = permute_stream(n, _source_seed(seed, s), epoch * d, t) + offset
            offset += n
        return samples.reshape(pos.shape), ids.reshape(pos.shape)

    def epoch_order(
        self, seed: int, epoch: int, positions: npt.ArrayLike, aug_repeats: int = 1
    ) -> npt.NDArray[np.int64]:
        """The global sample numbers at ``positions`` (see :meth:`locate`); in the mix, this takes the
        place of ``rank_dataset.plan.epoch_order(T0, seed, epoch, positions, aug_repeats)``."""
        return self.locate(seed, epoch, positions, aug_repeats)[0]
