"""Weighted mixing of several sources into one epoch order.

A mix of sources ``s = 0..S-1`` (:mod:`rank_dataset.plan.sources`) with ``N_s`` samples each takes ``c_s``
samples of source ``s`` per epoch (:func:`~rank_dataset.plan.counts.mix_counts`), ``T0 = sum(c_s)`` in all.
Sample ``k`` of source ``s`` has the global number ``sum(N_0..N_{s-1}) + k``.

Which samples an epoch takes: each source is an endless stream whose pass ``j`` is the permutation
of its samples fixed by ``(seed, s, j)``; epoch ``e`` takes stream positions ``[e*c_s, (e+1)*c_s)``.
So a source never repeats a sample before all of its samples have been used, and from epoch 0 up to
any epoch each sample has been taken ``floor`` or ``ceil`` of ``epochs * c_s / N_s`` times. (Within
one epoch that does not start or end on a pass boundary a sample may be taken once more or once less
than that: the tail of one pass and the head of the next are drawn independently.)

Schedules: a source's rule may change from given epochs on (:class:`~rank_dataset.plan.sources.Source`);
the counts of each epoch are then those of the rules in force (:attr:`MixPlan.changes`), ``T0`` stays
fixed, and epoch ``e`` takes stream positions from the sum of the source's counts in the epochs before
``e`` on (:meth:`MixPlan.stream_starts`), so both guarantees above hold across changes.

The epoch order: slots ``[0, T0)`` belong to the sources in list order (``c_0`` slots, then ``c_1``,
...), and position ``p`` of the order holds slot ``permute(T0, seed, epoch, p mod T0)``, which
interleaves the sources. The shard layout (``R``, padding by wrapping, mini-epochs, ranks) is the
plain one of :mod:`rank_dataset.plan.spec` over ``T0`` positions. Everything costs O(positions asked for).

Repeated augmentation (``aug_repeats = k``): position ``p`` holds draw ``p // k``; the epoch's
``D = ceil(T0 / k)`` draws are shared among the sources by their counts
(:func:`~rank_dataset.plan.counts.mix_draws`), the ``(seed, epoch)`` permutation of ``[0, D)`` interleaves
them, and each stream advances by its draws.
With ``k = 1`` that is the order above.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.core.checks import MAX_EXACT, check_int, check_ints
from rank_dataset.core.parsers import Parser, resolve_parser
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.counts import mix_draws, mix_schedule, mix_targets
from rank_dataset.plan.permutation import (
    grid_each,
    permute,
    permute_keyed,
    permute_stream,
    round_keys_each,
    splitmix64,
    splitmix64_array,
)
from rank_dataset.plan.schedule import in_force_at
from rank_dataset.plan.sources import Source, SourceInfo

__all__ = ["MixPlan", "Mixture", "changes_from_list", "combine_fingerprints", "source_seed", "source_seeds"]

_MASK64 = (1 << 64) - 1
_FEW_SOURCES = 16  # up to this many sources, evaluate each one's permutation by a call of its own
_BLOCK = 1 << 16  # positions located at a time in a mix of many sources: the temporaries stay in cache


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


def source_seed(seed: int, source: int) -> int:
    """The key of source ``source``'s stream, derived from the mix's ``seed``."""
    return splitmix64(splitmix64(seed & _MASK64) ^ splitmix64((source + 0x5EED) & _MASK64))


def source_seeds(seed: int, count: int) -> npt.NDArray[np.uint64]:
    """:func:`source_seed` of sources ``0..count-1``, in numpy."""
    sources = np.arange(0x5EED, 0x5EED + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return splitmix64_array(np.uint64(splitmix64(seed & _MASK64)) ^ splitmix64_array(sources))


def changes_from_list(value: Any, name: str) -> tuple[Any, ...]:
    """JSON lists ``[[first_epoch, [counts]], ...]`` as pairs, for :class:`MixPlan` to check; TypeError naming
    ``name`` if ``value`` is not a list."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of [first_epoch, counts], got {value!r}")
    return tuple((c[0], tuple(c[1])) if isinstance(c, Sequence) and len(c) == 2 else c for c in value)


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
        changes = changes_from_list(data.get("changes", ()), "changes")
        return cls(tuple(data["sizes"]), tuple(data["counts"]), data["epoch_size"], changes)

    def counts_at(self, epoch: int) -> tuple[int, ...]:
        """The counts in force at ``epoch``."""
        return in_force_at(((0, self.counts), *self.changes), epoch)

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

    def check_draws(self, aug_repeats: int, names: Sequence[str] | None = None) -> None:
        """Raise ValueError if a source's count, in any epoch, is too small for one draw of ``aug_repeats``
        (naming it by ``names`` if given)."""
        for counts in (self.counts, *(c for _, c in self.changes)):
            mix_draws(counts, aug_repeats, names)

    def source_of(self, samples: npt.ArrayLike, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[np.integer[Any]]:
        """The source of each global sample number (the source ``s`` with ``offset_s <= sample < offset_{s+1}``),
        as ``dtype`` (int64 by default; any integer dtype that holds the source numbers)."""
        return Bounds(self.sizes).part_of(samples, dtype)

    def draws(self, aug_repeats: int = 1, epoch: int = 0) -> tuple[int, ...]:
        """Each source's draws in ``epoch`` when draws are ``aug_repeats`` positions each (see :func:`mix_draws`)."""
        return tuple(mix_draws(self.counts_at(epoch), aug_repeats))

    def stream_positions(
        self, seed: int, epoch: int, draws: npt.NDArray[np.int64], aug_repeats: int = 1
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The source of each of ``epoch``'s draws ``draws`` (each in ``[0, D)``) and its position in that
        source's stream, as :meth:`locate` reads them."""
        counts = self.draws(aug_repeats, epoch)
        slots = permute(sum(counts), seed, epoch, draws)
        bounds = Bounds(counts)
        ids = bounds.part_of(slots)
        slots += (np.array(self.stream_starts(epoch, aug_repeats), np.int64) - bounds.starts[:-1])[ids]
        return ids, slots

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
            samples[where] = permute_stream(n, source_seed(seed, s), bases[s], t, stop=draws[s]) + offset
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
        permutations evaluated together (:func:`~rank_dataset.plan.permutation.permute_keyed`), not a call
        per source and pass. The grid and round keys are computed once per source and pass, a block of
        positions at a time."""
        sizes = np.asarray(self.sizes, np.int64)
        heads = [divmod(int(b), n) for n, b in zip(self.sizes, bases)]  # each source's stream start
        first_pass = np.array([f for f, _ in heads], np.int64)
        head = np.array([h for _, h in heads], np.int64)
        seeds = source_seeds(seed, len(self.sizes))
        rows, col_bits = grid_each(sizes)
        offsets = prefix_sums(sizes)[:-1]
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
        epoch_size: ``T0`` (None: as :func:`~rank_dataset.plan.counts.mix_counts` decides).
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
        if not is_test:
            self.plan.check_draws(aug_repeats, [s.name for s in sources])
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
