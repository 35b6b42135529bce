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

from rank_dataset._bounds import Bounds
from rank_dataset._checks import MAX_EXACT, check_int
from rank_dataset.parsers import Parser, resolve_parser
from rank_dataset.permutation import _splitmix64, permute

__all__ = [
    "MixPlan",
    "Mixture",
    "Source",
    "SourceInfo",
    "as_sources",
    "combine_fingerprints",
    "mix_counts",
    "mix_targets",
]

_MASK64 = (1 << 64) - 1
_FEW_PASSES = 8  # up to this many passes of a source in one epoch, group positions by masks, not a sort

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

    Examples:
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
    if not 1 <= total <= MAX_EXACT:
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


def mix_targets(sizes: Sequence[int], sources: Sequence[Source], counts: Sequence[int]) -> list[float]:
    """What each source's rule asks an epoch to take, before rounding: ``repeat * N_s``, ``choose``,
    or the weighted share of what the fixed counts leave of ``T0 = sum(counts)``.

    Examples:
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

    Examples:
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
        if total > MAX_EXACT or sum(self.sizes) > MAX_EXACT:
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
        return tuple(Bounds(self.sizes).starts[:-1].tolist())

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
        return Bounds(self.sizes).part_of(samples, dtype)

    def locate(
        self, seed: int, epoch: int, positions: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The global sample numbers and source ids at ``positions`` of the epoch order.

        Args:
            seed: any int; with ``epoch`` it fixes the order.
            epoch: an int >= 0.
            positions: ints >= 0, any shape; a position ``p >= T0`` is padding and holds what ``p mod T0``
                holds (as in :func:`rank_dataset.plan.epoch_order`).

        Returns:
            ``(samples, source_ids)``: two int64 arrays of the shape of ``positions``.
        """
        check_int("seed", seed)
        check_int("epoch", epoch, low=0)
        pos = np.asarray(positions)
        if pos.size and not np.issubdtype(pos.dtype, np.integer):
            raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
        flat = pos.astype(np.int64).reshape(-1)
        if flat.size and int(flat.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(flat.min())}")
        if flat.size and int(flat.max()) >= self.epoch_size:
            flat %= self.epoch_size
        slots = permute(self.epoch_size, seed, epoch, flat)
        slot_bounds = Bounds(self.counts)
        starts = slot_bounds.starts
        ids = slot_bounds.part_of(slots)
        samples = np.empty_like(slots)
        offset = 0
        for s, (n, c) in enumerate(zip(self.sizes, self.counts)):
            where = np.flatnonzero(ids == s) if len(self.sizes) > 1 else slice(None)
            # Slot j of source s is its stream position epoch * c + j, i.e. sample t % n of pass
            # first_pass + t // n, with t = head + j.
            first_pass, head = divmod(epoch * c, n)
            t = slots[where]
            t += head - int(starts[s])
            key = _source_seed(seed, s)
            spanned = (head + c - 1) // n + 1  # the passes this epoch's slots of s touch
            if spanned == 1:
                samples[where] = permute(n, key, first_pass, t) + offset
            elif spanned <= _FEW_PASSES:  # a few passes: one mask each, cheaper than a sort
                picked = np.empty_like(t)
                for p in range(spanned):
                    group = np.flatnonzero((t >= p * n) & (t < (p + 1) * n))
                    picked[group] = permute(n, key, first_pass + p, t[group] - p * n)
                samples[where] = picked + offset
            elif t.size:
                passes, k = np.divmod(t, n)
                order = np.argsort(passes, kind="stable")
                cuts = np.flatnonzero(np.diff(passes[order])) + 1
                picked = np.empty_like(k)
                for group in np.split(order, cuts):
                    picked[group] = permute(n, key, first_pass + int(passes[group[0]]), k[group])
                samples[where] = picked + offset
            offset += n
        return samples.reshape(pos.shape), ids.reshape(pos.shape)

    def epoch_order(self, seed: int, epoch: int, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The global sample numbers at ``positions`` (see :meth:`locate`); in the mix, this takes the
        place of ``rank_dataset.plan.epoch_order(T0, seed, epoch, positions)``."""
        return self.locate(seed, epoch, positions)[0]


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
        sizes: ``N_s``, the samples of each source's files (each >= 1).
        fingerprints: gives the fingerprint of each source's files (see :func:`combine_fingerprints`);
            called once, when first needed.
        parser: the dataset's parser, for the sources that have none of their own.
        is_test: eval mode, which ignores weights: every sample of every source once, in order.
        epoch_size: ``T0`` (None: as :func:`mix_counts` decides).

    Raises:
        ValueError: a source with no samples (named), or counts that cannot be met.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        sizes: Sequence[int],
        fingerprints: Callable[[], tuple[str, ...]],
        parser: Parser | None,
        is_test: bool,
        epoch_size: int | None,
    ) -> None:
        if len(sizes) != len(sources):
            raise ValueError(f"{len(sources)} sources need as many sizes, got {len(sizes)}")
        for i, (source, n) in enumerate(zip(sources, sizes)):
            if n == 0:
                raise ValueError(f"source {i} {source.name!r} has no samples: every line is empty or whitespace")
        self.sources = tuple(sources)
        self.is_test = is_test
        self.plan = MixPlan.every_sample(sizes) if is_test else MixPlan.from_sources(sizes, sources, epoch_size)
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

    def infos(self) -> tuple[SourceInfo, ...]:
        """Each source with its numbers (see :class:`SourceInfo`)."""
        mix = self.plan
        targets = list(map(float, mix.sizes)) if self.is_test else mix_targets(mix.sizes, self.sources, mix.counts)
        return tuple(
            SourceInfo(source, n, c, offset, target, fingerprint)
            for source, n, c, offset, target, fingerprint in zip(
                self.sources, mix.sizes, mix.counts, mix.offsets, targets, self.fingerprints
            )
        )

    def source_ids(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.integer[Any]]:
        """The source number of each global sample number in ``indices``, as :attr:`source_dtype`."""
        return self.plan.source_of(indices, self.source_dtype)

    def parser(self, source: int) -> Parser | None:
        """The parser of source ``source`` (only when some source has its own: see :attr:`parsers`)."""
        assert self.parsers is not None
        return self.parsers[source]
