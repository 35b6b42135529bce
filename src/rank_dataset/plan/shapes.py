"""Batches by shape: global batches of one bucket each, of a fixed size or up to a cost budget.

The stream is walked in *draws* as the plain step stream (:mod:`rank_dataset.plan.steps`, ``aug_repeats`` 1):
draw ``q = e * N + d`` is position ``d`` of epoch ``e``'s order. Each sample has a bucket (one bucket for all
when only a budget is given).

- **By count** (``batch_size`` ``B``): the samples of bucket ``b``, in stream order over every epoch, are cut
  into runs of ``B``; global batch ``t`` is the ``t``-th run completed (emitted at the draw of its last sample).
  A partial run carries into the next epoch, so the runs before epoch ``e`` are ``sum_b floor(e * n_b / B)``.
- **By budget** (``max_cost`` and an integer ``cost`` per sample): each bucket's samples, in stream order, are
  cut greedily into runs whose total cost stays within ``max_cost``. A run open at an epoch's end carries into
  the next epoch; when the first of its bucket's samples there does not fit, it is emitted as it is at that
  sample's draw. A sample costlier than ``max_cost`` is refused, as is a bucket whose samples all cost 0. The
  runs before epoch ``e`` take one pass an epoch; a resume state keeps an anchor ``(epoch, first step, carried
  counts)`` so that a resume does not replay.

A global batch's samples are in stream order and do not depend on the world size ``W``. By count, rank ``r``
takes the block ``[r*B/W, (r+1)*B/W)``; by budget, :func:`split_by_cost` splits the batch. A batch of fewer
samples than ``W`` is refused, naming the step.

The shard of window ``(e, m)`` holds this rank's share of every batch whose *last* draw lies in the window; its
positions are counted from the start of epoch ``e`` (negative for a carried sample of an earlier epoch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import prefix_sums, ranges
from rank_dataset.core.checks import check_int
from rank_dataset.plan.permutation import permute
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.steps import StepLayout, stream_samples

__all__ = [
    "SDXL_RESOLUTIONS",
    "ShapeLayout",
    "ShapeStream",
    "aspect_ratio_groups",
    "bucket_ids",
    "nearest_resolution",
    "split_by_cost",
]

#: SDXL's training resolutions (width, height), about a megapixel each: the example list of
#: :func:`nearest_resolution`.
SDXL_RESOLUTIONS: tuple[tuple[int, int], ...] = (
    (512, 2048), (512, 1984), (512, 1920), (512, 1856), (576, 1792), (576, 1728), (576, 1664), (640, 1600),
    (640, 1536), (704, 1472), (704, 1408), (704, 1344), (768, 1344), (768, 1280), (832, 1216), (832, 1152),
    (896, 1152), (896, 1088), (960, 1088), (960, 1024), (1024, 1024), (1024, 960), (1088, 960), (1088, 896),
    (1152, 896), (1152, 832), (1216, 832), (1280, 768), (1344, 768), (1408, 704), (1472, 704), (1536, 640),
    (1600, 640), (1664, 576), (1728, 576), (1792, 576), (1856, 512), (1920, 512), (1984, 512), (2048, 512),
)  # fmt: skip


def aspect_ratio_groups(
    width: npt.ArrayLike, height: npt.ArrayLike, bounds: Sequence[float] | None = None
) -> npt.NDArray[np.int64]:
    """Each sample's aspect-ratio group: with no ``bounds``, detectron2's two groups (0: ``w > h``, 1:
    ``w <= h``); with ``bounds`` (increasing ratios ``w / h``), group ``i`` holds the ratios in
    ``[bounds[i-1], bounds[i])`` (``len(bounds) + 1`` groups).

    Examples:
        >>> aspect_ratio_groups([640, 480, 500], [480, 640, 500]).tolist()
        [0, 1, 1]
        >>> aspect_ratio_groups([640, 480, 500], [480, 640, 500], bounds=[0.8, 1.2]).tolist()
        [2, 0, 1]
    """
    w, h = _sizes(width, height)
    if bounds is None:
        return (w <= h).astype(np.int64)
    edges = np.asarray(bounds, np.float64)
    if edges.ndim != 1 or not edges.size or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bounds must be increasing ratios (width / height), got {list(bounds)!r}")
    groups: npt.NDArray[np.int64] = np.searchsorted(edges, w / h, side="right").astype(np.int64)
    return groups


def nearest_resolution(
    width: npt.ArrayLike, height: npt.ArrayLike, resolutions: Sequence[tuple[int, int]] = SDXL_RESOLUTIONS
) -> npt.NDArray[np.int64]:
    """Each sample's resolution bucket: the index in ``resolutions`` (``(width, height)`` pairs) of the one
    whose aspect ratio is nearest the sample's in log scale (ties: the earlier), as SDXL's and kohya's
    bucketing do.

    Example:
        >>> nearest_resolution([1024, 1920, 600], [1024, 1080, 1200], [(1024, 1024), (1344, 768), (768, 1344)]).tolist()
        [0, 1, 2]
    """
    w, h = _sizes(width, height)
    res = np.asarray(resolutions, np.float64)
    if res.ndim != 2 or res.shape[1] != 2 or not res.shape[0] or np.any(res <= 0):
        raise ValueError("resolutions must be a non-empty list of positive (width, height) pairs")
    target = np.log(res[:, 0] / res[:, 1])
    ratio = np.log(w / h)
    nearest: npt.NDArray[np.int64] = np.abs(ratio[:, None] - target[None, :]).argmin(axis=1).astype(np.int64)
    return nearest


def _sizes(width: npt.ArrayLike, height: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    w, h = np.asarray(width, np.float64), np.asarray(height, np.float64)
    if w.shape != h.shape or w.ndim != 1:
        raise ValueError(f"width and height must be 1-d arrays of one length, got shapes {w.shape} and {h.shape}")
    bad = np.flatnonzero(~((w > 0) & (h > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"sample {i} has no positive size: width {w[i]}, height {h[i]}")
    return w, h


def bucket_ids(bucket_by: Any, num_samples: int) -> npt.NDArray[np.int64]:
    """Each sample's bucket as compact ids ``0..K-1`` (in the order of the labels or ids given): from the dict
    :func:`~rank_dataset.group_by` returns (label -> sample indices, each sample in one group) or an int array
    of ``num_samples``.

    Example:
        >>> bucket_ids({"wide": [0, 2], "tall": [1]}, 3).tolist(), bucket_ids([7, 3, 7], 3).tolist()
        ([0, 1, 0], [1, 0, 1])
    """
    if isinstance(bucket_by, Mapping):
        ids = np.full(num_samples, -1, np.int64)
        for b, members in enumerate(bucket_by.values()):
            idx = np.asarray(members, np.int64).reshape(-1)
            if idx.size and (idx.min() < 0 or idx.max() >= num_samples):
                raise ValueError(f"bucket_by: a group holds a sample outside [0, {num_samples})")
            if np.any(ids[idx] >= 0):
                raise ValueError("bucket_by: a sample is in two groups (each sample needs one bucket)")
            ids[idx] = b
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            raise ValueError(f"bucket_by: sample {int(missing[0])} is in no group (each sample needs one bucket)")
        return np.unique(ids, return_inverse=True)[1].astype(np.int64)
    arr = np.asarray(bucket_by)
    if arr.shape != (num_samples,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"bucket_by must be a grouping dict or an int array of the {num_samples} samples, got "
            f"{type(bucket_by).__name__} of shape {arr.shape} and dtype {arr.dtype}"
        )
    return np.unique(arr, return_inverse=True)[1].astype(np.int64).reshape(-1)


def split_by_cost(costs: npt.ArrayLike, offsets: npt.ArrayLike, world_size: int) -> npt.NDArray[np.int64]:
    """The rank of each sample of the batches ``costs[offsets[i]:offsets[i+1]]`` (each of at least
    ``world_size`` samples): a greedy split by rounds, longest first. A batch's samples are taken by cost,
    highest first (ties: the earlier); round ``k`` hands its ``W`` samples, highest first, to the ranks in
    order of their cost so far, lowest first (ties: the lower rank). Round 0 gives each rank one sample.
    (The kernel ``split_costs``: a sort of each batch and ``ceil(batch / W)`` rounds.)

    Example:
        >>> split_by_cost([9, 1, 1, 1, 8], [0, 5], 2).tolist()
        [0, 1, 0, 1, 1]
    """
    world = check_int("world_size", world_size, low=1)
    cost = np.asarray(costs, np.int64)
    off = np.asarray(offsets, np.int64)
    lengths = np.diff(off)
    if lengths.size and lengths.min() < world:
        raise ValueError(f"a batch of {int(lengths.min())} samples cannot be split among {world} ranks")
    return native.split_costs(cost, off, world)


_COSTS: Literal[0] = 0  # the columns of ShapeStream._epoch
_GROUPED: Literal[1] = 1


def _kept(column: npt.NDArray[Any] | None) -> npt.NDArray[Any]:
    """``column`` of an epoch, which its caller knows the stream keeps (see ``ShapeStream._epoch``)."""
    if column is None:
        raise RuntimeError("an epoch column this stream does not keep was asked for")
    return column


class _Table:
    """One epoch's batches in step order: batch ``i`` holds the ``j``-th samples of bucket ``bucket[i]`` in the
    stream (counting every epoch), ``j`` in ``[lo[i], hi[i])``, and is emitted at draw ``ends[i]`` of the epoch.
    ``offsets`` are the batches' cumulative sizes."""

    __slots__ = ("bucket", "ends", "hi", "lo", "offsets")

    def __init__(self, ends: npt.NDArray[np.int64], bucket: npt.NDArray[np.int64], lo: npt.NDArray[np.int64],
                 hi: npt.NDArray[np.int64]) -> None:  # fmt: skip
        self.ends, self.bucket, self.lo, self.hi = ends, bucket, lo, hi
        self.offsets = prefix_sums(hi - lo)


class ShapeStream:
    """The batches by shape of ``num_samples`` samples under ``seed`` (see the module).

    Args:
        buckets: each sample's bucket (compact ids from :func:`bucket_ids`), or None: one bucket.
        batch_size: ``B`` of a stream by count (None: by budget).
        max_cost: the budget of a stream by budget (None: by count).
        cost: each sample's integer cost (>= 0), with ``max_cost``.

    Raises:
        ValueError: both or neither of ``batch_size`` and ``max_cost``; a cost array of another length, negative
            or not integer; a sample costlier than ``max_cost`` (naming it); by budget, a bucket whose samples all
            cost 0 (its run would never end).
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        buckets: npt.ArrayLike | None = None,
        *,
        batch_size: int | None = None,
        max_cost: int | None = None,
        cost: npt.ArrayLike | None = None,
    ) -> None:
        n = self.num_samples = check_int("num_samples", num_samples, low=1)
        self.seed = seed
        ids = np.zeros(n, np.int64) if buckets is None else np.ascontiguousarray(buckets, np.int64)
        if ids.shape != (n,):
            raise ValueError(f"buckets must hold one id per sample ({n}), got shape {ids.shape}")
        self.buckets = ids
        self.sizes = np.bincount(ids)  # n_b
        self.starts = prefix_sums(self.sizes)
        k = self.sizes.size
        # The keys of the epochs' counting sort (a gather of 2 bytes a draw, not 8); none for one bucket.
        self._keys = ids.astype(np.uint16) if 1 < k <= 1 << 16 else None
        self._index = np.uint32 if n <= 1 << 32 else np.int64  # the dtype of an epoch's draws
        if (batch_size is None) == (max_cost is None):
            raise ValueError("give a global batch size or a max_cost (with cost), not both nor neither")
        self.batch_size = None if batch_size is None else check_int("global_batch_size", batch_size, low=1)
        self.max_cost = None if max_cost is None else check_int("max_cost", max_cost, low=1)
        self.cost: npt.NDArray[np.int64] | None = None
        self._costs: npt.NDArray[Any] | None = None
        if max_cost is not None:
            if cost is None:
                raise ValueError("max_cost needs cost: an integer array of each sample's cost")
            raw = np.asarray(cost)
            if raw.shape != (n,) or not np.issubdtype(raw.dtype, np.integer):
                raise ValueError(f"cost must be an integer array of the {n} samples, got {raw.dtype} {raw.shape}")
            c = raw.astype(np.int64)
            if c.min() < 0:
                raise ValueError(f"cost of sample {int(np.argmin(c))} is negative: {int(c.min())}")
            over = np.flatnonzero(c > max_cost)
            if over.size:
                i = int(over[0])
                raise ValueError(
                    f"sample {i} costs {int(c[i])}, more than max_cost={max_cost}: it fits no batch "
                    f"({over.size} samples are over the budget)"
                )
            priced = np.bincount(ids[c > 0], minlength=k) if k > 1 else np.array([int(c.any())])
            free = np.flatnonzero(priced == 0)
            if free.size:
                raise ValueError(
                    f"every sample of bucket {int(free[0])} costs 0: a run of it would never reach max_cost and "
                    "end (give its samples a cost, or put them in a bucket with others)"
                )
            self.cost = c
            # The costs an epoch gathers by draw: 4 bytes each where they fit.
            self._costs = c.astype(np.uint32) if max_cost < 1 << 32 else c
        elif cost is not None:
            raise ValueError("cost is for a stream by budget: give max_cost with it")
        self._arrays: dict[int, tuple[npt.NDArray[Any] | None, npt.NDArray[Any] | None]] = {}
        self._tables: dict[int, _Table] = {}
        self._runs: dict[int, int] = {0: 0}  # epoch -> runs before it (by budget)
        zeros = np.zeros(k, np.int64)
        self._carry: dict[int, npt.NDArray[np.int64]] = {0: zeros}  # epoch -> each bucket's open run's samples
        self._fill: dict[int, npt.NDArray[np.int64]] = {0: zeros}  # epoch -> each bucket's open run's cost
        empty = np.empty(0, np.int64)
        self._share: tuple[tuple[int, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = ((), (empty, empty))
        if self._costs is None:
            digest = hashlib.sha256(ids.data)  # the array's buffer, not a copy of it
            digest.update(repr((self.batch_size, self.max_cost)).encode())
        else:  # runs carried across epochs' ends; the ids and costs as compact as they are kept
            digest = hashlib.sha256(repr(("carry", n, k, self.max_cost)).encode())
            if k > 1:
                digest.update((ids if self._keys is None else self._keys).data)
            digest.update(self._costs.data)
        self.digest = digest.hexdigest()[:16]

    # -- one epoch's order, grouped by bucket ------------------------------------------------------------

    def _epoch(self, epoch: int) -> tuple[npt.NDArray[Any] | None, npt.NDArray[Any] | None]:
        """``(costs, grouped)`` of ``epoch``: by budget, the cost of the sample at each draw (None by count);
        with several buckets, the draws grouped by bucket, in draw order within each (bucket ``b``'s at
        ``starts[b]:starts[b+1]``; None for one bucket: the draws in order). One pass over the epoch: the
        permutation, and a gather of the keys and a counting sort, a gather of the costs. The epochs next to
        the latest asked for are kept."""
        if epoch in self._arrays:
            return self._arrays[epoch]
        n = self.num_samples
        order = permute(n, self.seed, epoch, np.arange(n, dtype=np.int64))
        k = self.sizes.size
        grouped: npt.NDArray[Any] | None = None
        if self._keys is not None:
            grouped = native.bucket_order(self._keys[order], k, self._index)[0]
        elif k > 1:
            grouped = np.argsort(self.buckets[order], kind="stable").astype(self._index)
        costs = None if self._costs is None else self._costs[order]
        self._arrays = {e: a for e, a in self._arrays.items() if abs(e - epoch) <= 1}
        self._arrays[epoch] = costs, grouped
        return costs, grouped

    def _draws_of(self, b: npt.NDArray[np.int64], j: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The global draws of the ``j``-th samples (in the stream, counting every epoch) of buckets ``b``."""
        ep, r = np.divmod(j, self.sizes[b])
        if self.sizes.size == 1:
            return ep * self.num_samples + r
        out = self._gather(_GROUPED, ep, self.starts[b] + r)
        out += ep * self.num_samples
        return out

    def _costs_at(self, draws: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The costs of the samples at global draws ``draws`` (by budget)."""
        ep, d = np.divmod(draws, self.num_samples)
        return self._gather(_COSTS, ep, d)

    def _gather(
        self, column: Literal[0, 1], epochs: npt.NDArray[np.int64], at: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """``_epoch(e)[column][at]`` element by element, ``e`` the element's epoch in ``epochs``; the column
        must be one the stream keeps (costs by budget, the grouping with several buckets)."""
        out = np.empty(at.shape, np.int64)
        if not at.size:
            return out
        lo, hi = int(epochs.min()), int(epochs.max())
        for e in range(lo, hi + 1):
            where = epochs == e if lo < hi else slice(None)
            out[where] = _kept(self._epoch(e)[column])[at[where]]
        return out

    # -- the batches of one epoch ----------------------------------------------------------------------

    def _table(self, epoch: int) -> _Table:
        """The batches emitted in ``epoch``, in step order (see :class:`_Table`). The last two are kept."""
        if epoch in self._tables:
            return self._tables[epoch]
        if self.batch_size is not None:
            table = self._count_table(epoch)
        else:
            known = max(e for e in self._carry if e <= epoch)
            for e in range(known, epoch):  # the runs carried into ``epoch`` follow from the epochs before it
                self._table(e)
            table = self._budget_table(epoch)
        self._tables = {e: t for e, t in self._tables.items() if e == epoch - 1}
        self._tables[epoch] = table
        return table

    def _count_table(self, epoch: int) -> _Table:
        size, sizes = self.batch_size, self.sizes
        assert size is not None
        grouped = self._epoch(epoch)[1]
        before, after = epoch * sizes // size, (epoch + 1) * sizes // size  # runs of each bucket completed
        count = after - before
        b = np.repeat(np.arange(sizes.size), count)
        k = ranges(before, count)
        hi = (k + 1) * size
        ends = self.starts[b] + hi - 1 - epoch * sizes[b]  # the grouped draw completing each
        if grouped is not None:
            ends = grouped[ends].astype(np.int64)
        step = np.argsort(ends, kind="stable")
        return _Table(ends[step], b[step], hi[step] - size, hi[step])

    def _budget_table(self, epoch: int) -> _Table:
        assert self.cost is not None and self.max_cost is not None
        sizes, starts = self.sizes, self.starts
        carry, fill = self._carry[epoch], self._fill_of(epoch)
        costs, grouped = self._epoch(epoch)
        costs = _kept(costs)
        if grouped is not None:
            costs = costs[grouped]
        new, totals = native.pack_runs(costs, starts, self.max_cost, fill)
        cuts = np.flatnonzero(new)  # each closes the run before it (of its bucket)
        b = np.searchsorted(starts, cuts, side="right") - 1
        first = np.ones(cuts.size, bool)
        first[1:] = b[1:] != b[:-1]
        base = epoch * sizes[b]  # the stream index of the bucket's first sample of the epoch
        hi = base + cuts - starts[b]
        prev = np.concatenate(([0], cuts[:-1]))
        lo = np.where(first, base - carry[b], base + prev - starts[b])
        carried = hi == base  # a carried run that the epoch's first sample of its bucket does not fit
        at = np.where(carried, cuts, np.maximum(cuts - 1, 0))
        if grouped is not None:
            at = grouped[at].astype(np.int64)
        step = np.argsort(at * 2 + ~carried, kind="stable")  # emitted at that sample's draw, before it
        last = np.full(sizes.size, -1, np.int64)
        np.maximum.at(last, b, cuts)  # each bucket's last cut
        out = np.where(last >= 0, starts[1:] - last, carry + sizes)
        self._carry[epoch + 1], self._fill[epoch + 1] = out, totals
        self._runs[epoch + 1] = self._runs[epoch] + cuts.size
        return _Table(at[step], b[step], lo[step], hi[step])

    def _fill_of(self, epoch: int) -> npt.NDArray[np.int64]:
        """Each bucket's open run's cost at ``epoch``'s start (from its samples, after a resume's anchor)."""
        if epoch not in self._fill:
            assert self.cost is not None
            carry = self._carry[epoch]
            b = np.repeat(np.arange(carry.size), carry)
            j = ranges(epoch * self.sizes - carry, carry)
            costs = self._costs_at(self._draws_of(b, j))
            fill = np.zeros(carry.size, np.int64)
            np.add.at(fill, b, costs)
            if fill.size and fill.max() > (self.max_cost or 0):
                raise ValueError(f"invalid anchor: the runs carried into epoch {epoch} cost more than max_cost")
            self._fill[epoch] = fill
        return self._fill[epoch]

    def table(self, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The batches emitted in ``epoch``, in step order: ``(ends, members, offsets)``, the draw (within the
        epoch) at which each is emitted, and the batches' samples as global draws, batch ``i`` being
        ``members[offsets[i]:offsets[i+1]]`` (all of them: a pass over the epoch's batches)."""
        t = self._table(epoch)
        lengths = t.hi - t.lo
        b = np.repeat(t.bucket, lengths)
        j = ranges(t.lo, lengths)
        return t.ends, self._draws_of(b, j), t.offsets

    def batch_offsets(self, epoch: int) -> npt.NDArray[np.int64]:
        """The cumulative sizes of the batches emitted in ``epoch``, in step order."""
        return self._table(epoch).offsets

    def steps_before(self, epoch: int) -> int:
        """The global batches completed before ``epoch`` (by budget: the run counts of the epochs before it,
        from the nearest epoch known, see :meth:`anchor`)."""
        if self.batch_size is not None:
            return int(np.sum(epoch * self.sizes // self.batch_size))
        known = max(e for e in self._runs if e <= epoch)
        for e in range(known, epoch):
            self._table(e)
        return self._runs[epoch]

    def anchor(self, epoch: int, steps_before: int, carry: Sequence[int]) -> None:
        """Record that ``steps_before`` batches precede ``epoch`` and each bucket's open run holds its last
        ``carry[b]`` samples of the stream before it (from a resume state).

        Raises:
            ValueError: ``carry`` not one count >= 0 per bucket.
        """
        counts = np.asarray(carry)
        e = check_int("epoch", epoch, low=0)
        if (
            counts.shape != self.sizes.shape
            or not np.issubdtype(counts.dtype, np.integer)
            or counts.min() < 0
            or np.any(counts > e * self.sizes)
        ):
            raise ValueError(
                f"invalid anchor: carry must hold one count for each of the {self.sizes.size} buckets, each at "
                f"most the bucket's samples of the epochs before {e}, got {list(carry)[:8]!r}"
            )
        self._runs[e] = check_int("steps", steps_before, low=0)
        self._carry[e] = counts.astype(np.int64)
        self._fill.pop(e, None)
        self._tables = {}

    def anchor_of(self, step: int) -> tuple[int, int, list[int]] | None:
        """By budget, the latest epoch known to start at or before ``step``, the batches before it and the
        runs carried into it: what a resume state keeps so that a resume does not replay the epochs (None by
        count: not needed)."""
        if self.batch_size is not None:
            return None
        epoch = max(e for e, s in self._runs.items() if s <= step)
        return epoch, self._runs[epoch], self._carry[epoch].tolist()

    def epoch_of(self, step: int) -> int:
        """The epoch in which global batch ``step`` is completed."""
        if self.batch_size is not None:  # from an estimate, down to an epoch that starts at or before the step
            e = max(0, int(step / (float(self.num_samples) / self.batch_size)) - 1)
            while e and self.steps_before(e) > step:
                e -= 1
        else:
            e = max(e for e, s in self._runs.items() if s <= step)
        while self.steps_before(e + 1) <= step:
            e += 1
        return e

    def share(
        self, first: int, stop: int, world_size: int, rank: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Rank ``rank`` of ``world_size``'s samples of global batches ``[first, stop)`` (all completed in one
        epoch): ``(draws, counts)``, its global draws in step order and how many of them each step holds.

        Raises:
            ValueError: by count, a batch size that ``world_size`` does not divide; by budget, a batch of fewer
                samples than ``world_size`` (naming the step).
        """
        world = check_int("world_size", world_size, low=1)
        key = (first, stop, world, rank)
        if self._share[0] == key:
            return self._share[1]
        self._share = key, self._split(first, stop, world, rank)
        return self._share[1]

    def _split(
        self, first: int, stop: int, world: int, rank: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        if stop <= first:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        epoch = self.epoch_of(first)
        base = self.steps_before(epoch)
        t = self._table(epoch)
        rows = slice(first - base, stop - base)
        b, lo, hi = t.bucket[rows], t.lo[rows], t.hi[rows]
        if self.batch_size is not None:
            self.check(world)
            block = self.batch_size // world
            j = (lo + rank * block)[:, None] + np.arange(block)[None, :]
            mine = self._draws_of(np.broadcast_to(b[:, None], j.shape), j).reshape(-1)
            return mine, np.full(stop - first, block, np.int64)
        assert self.cost is not None
        lengths = hi - lo
        short = np.flatnonzero(lengths < world)
        if short.size:
            u = first + int(short[0])
            raise ValueError(
                f"global batch {u} holds {int(lengths[short[0]])} samples within max_cost={self.max_cost}, fewer "
                f"than the {world} ranks: each rank needs one (a smaller world size, a larger max_cost or "
                "coarser buckets)"
            )
        off = prefix_sums(lengths)
        draws = self._draws_of(np.repeat(b, lengths), ranges(lo, lengths))
        ranks = split_by_cost(self._costs_at(draws), off, world)
        mine = ranks == rank
        batch = np.repeat(np.arange(stop - first), lengths)
        return draws[mine], np.bincount(batch[mine], minlength=stop - first).astype(np.int64)

    def check(self, world_size: int, aug_repeats: int = 1) -> None:
        """Raise ValueError if ``world_size`` does not divide the batch size, or ``aug_repeats`` is not 1."""
        if aug_repeats != 1:
            raise ValueError(f"batches by shape take no aug_repeats must be 1, got {aug_repeats}")
        if self.batch_size is not None:
            BatchSchedule.of(self.batch_size).check(world_size)

    def window_of(self, step: int, mini_epoch: int) -> tuple[int, int]:
        """``(epoch, m)``: the window holding the draw at which global batch ``step`` is emitted."""
        epoch = self.epoch_of(step)
        ends = self._table(epoch).ends
        width = -(-self.num_samples // mini_epoch)
        return epoch, int(ends[step - self.steps_before(epoch)]) // width

    def steps_of(self, mini_epoch: int, epoch: int, mini_epoch_idx: int) -> tuple[int, int]:
        """The steps ``[first, stop)`` emitted at a draw of window ``(epoch, mini_epoch_idx)``."""
        width = -(-self.num_samples // mini_epoch)
        lo, hi = min(mini_epoch_idx * width, self.num_samples), min((mini_epoch_idx + 1) * width, self.num_samples)
        ends = self._table(epoch).ends
        base = self.steps_before(epoch)
        return base + int(np.searchsorted(ends, lo)), base + int(np.searchsorted(ends, hi))


class ShapeLayout(StepLayout):
    """The step layout of batches by shape (``ShardSpec.steps``, what a StepSampler loads): the windows and
    shares of a :class:`ShapeStream`. Equal to another of the same stream digest; its dict holds the digest only
    (a layout read back from it has no positions: the shard is built where the stream is).
    """

    def __init__(self, stream: ShapeStream) -> None:
        size = stream.batch_size if stream.batch_size is not None else 1
        super().__init__(BatchSchedule.of(size), None, stream.digest)
        object.__setattr__(self, "stream", stream)

    stream: ShapeStream

    def check(self, world_size: int, aug_repeats: int = 1) -> None:
        self.stream.check(world_size, aug_repeats)

    def window_of(self, step: int, num_samples: int, mini_epoch: int, aug_repeats: int = 1) -> tuple[int, int]:
        return self.stream.window_of(step, mini_epoch)

    def steps_of(
        self, num_samples: int, mini_epoch: int, epoch: int, mini_epoch_idx: int, aug_repeats: int = 1
    ) -> tuple[int, int]:
        return self.stream.steps_of(mini_epoch, epoch, mini_epoch_idx)

    def batch(
        self,
        step: int,
        num_samples: int,
        seed: int,
        aug_repeats: int = 1,
        mix: Any = None,
        world_size: int = 1,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Global batch ``step`` alone: its samples with the ranks' blocks in rank order, and where each starts
        (as :meth:`StepLayout.batch`). By count and on one rank, the batch in stream order; by budget, each
        rank's share (:func:`split_by_cost`), which depends on ``world_size``."""
        parts = [self.stream.share(step, step + 1, world_size, r)[0] for r in range(world_size)]
        bounds = prefix_sums([p.size for p in parts])
        return stream_samples(np.concatenate(parts), num_samples, seed), bounds

    def counts(self, world_size: int, rank: int, first: int, stop: int) -> npt.NDArray[np.int64]:
        """This rank's samples of each global batch ``[first, stop)`` (of one window)."""
        return self.stream.share(first, stop, world_size, rank)[1]

    def positions(
        self,
        num_samples: int,
        world_size: int,
        rank: int,
        mini_epoch: int,
        epoch: int,
        mini_epoch_idx: int,
        aug_repeats: int = 1,
    ) -> npt.NDArray[np.int64]:
        """This rank's samples of window ``(epoch, mini_epoch_idx)`` as draws counted from the start of ``epoch``
        (negative: a carried sample of an earlier epoch)."""
        first, stop = self.stream.steps_of(mini_epoch, epoch, mini_epoch_idx)
        draws = self.stream.share(first, stop, world_size, rank)[0]
        return draws - epoch * self.stream.num_samples

    def indices(
        self,
        positions: npt.NDArray[np.int64],
        num_samples: int,
        seed: int,
        epoch: int,
        aug_repeats: int = 1,
        mix: Any = None,
    ) -> npt.NDArray[np.int64]:
        return stream_samples(epoch * num_samples + positions, num_samples, seed)
