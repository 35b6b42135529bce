"""Batches by shape: global batches of one bucket each, of a fixed size or up to a cost budget.

The stream is walked in *draws* as the plain step stream (:mod:`rank_dataset.plan.steps`, ``aug_repeats`` 1):
draw ``q = e * N + d`` is position ``d`` of epoch ``e``'s order. Each sample has a bucket (an int id; one bucket
for all when only a budget is given).

- **By count** (``batch_size`` ``B``): the samples of bucket ``b``, in stream order, are cut into runs of ``B``
  (the ``j``-th sample of ``b`` in the stream, counting every epoch, joins run ``j // B``). A run is emitted as a
  global batch when its last sample is drawn; global batch ``t`` is the ``t``-th run so completed. A bucket's
  partial run at an epoch's end carries into the next epoch (its samples are read once in each epoch all the
  same: a run that straddles an epoch's end holds the last samples of one epoch and the first of the next). As
  every epoch holds ``n_b`` samples of bucket ``b``, the runs completed before epoch ``e`` are
  ``sum_b floor(e * n_b / B)``: the step of any window is known without replaying the epochs before it.
- **By budget** (``max_cost`` and an integer ``cost`` per sample): within each epoch and each bucket, the bucket's
  samples in stream order are cut greedily into the longest runs whose total cost is at most ``max_cost``; a
  run is emitted when its last sample is drawn. The runs start afresh each epoch (a bucket's last run of an
  epoch is emitted at its last sample, under the budget), so each epoch is its own and holds every sample
  once. A sample costlier than ``max_cost`` is refused. The runs before epoch ``e`` are the sum of the run
  counts of the epochs before it: each epoch's count is one pass over it, kept by :class:`ShapeStream` and
  carried in a resume state as an anchor ``(epoch, first step)`` so that a resume does not replay.

A global batch's samples are listed in stream order and do not depend on the world size ``W``. By count, rank
``r`` takes the contiguous block ``[r*B/W, (r+1)*B/W)`` as in the plain stream. By budget, the batch is split
by :func:`split_by_cost`: a greedy split by rounds (longest processing time first) that gives every rank at
least one sample and keeps the ranks' costs close; each rank keeps its samples in batch order. A batch of
fewer samples than ``W`` is refused, naming the step.

Windows (the shards) are cut on the epoch's draws as in :mod:`rank_dataset.plan.steps`: the shard of window
``(e, m)`` holds this rank's share of every batch whose *last* draw lies in the window. Its earlier samples may
lie in earlier windows (or epochs, for a carried run); the shard reads them again by their positions, which
are counted from the start of epoch ``e`` (negative for an earlier epoch).

Cost: one epoch's table is one pass over its ``N`` draws in numpy (the permutation, a stable sort of the
bucket ids, a cumulative sum), plus, by budget, one ``searchsorted`` per run in Python (``N / mean run``
iterations). A window's shard is then numpy over its batches' samples, and the split ``ceil(max run / W)``
numpy rounds over the window's batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

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
    Vectorised over the batches: ``ceil(max batch / W)`` rounds.

    Example:
        >>> split_by_cost([9, 1, 1, 1, 8], [0, 5], 2).tolist()
        [0, 1, 1, 0, 1]
    """
    world = check_int("world_size", world_size, low=1)
    cost = np.asarray(costs, np.int64)
    off = np.asarray(offsets, np.int64)
    lengths = np.diff(off)
    if lengths.size and lengths.min() < world:
        raise ValueError(f"a batch of {int(lengths.min())} samples cannot be split among {world} ranks")
    out = np.empty(cost.size, np.int64)
    if world == 1 or not cost.size:
        out[:] = 0
        return out
    nb = lengths.size
    batch = np.repeat(np.arange(nb), lengths)
    within = np.arange(cost.size) - off[:-1][batch]
    order = np.lexsort((within, -cost, batch))  # by batch, then cost high first, then position
    rounds = -(-int(lengths.max()) // world)
    grid = np.full((nb, rounds * world), -1, np.int64)  # item (sample number) at each sorted slot
    grid[batch[order], within[order]] = order
    totals = np.zeros((nb, world), np.int64)
    rows = np.arange(nb)
    for k in range(rounds):
        items = grid[:, k * world : (k + 1) * world]
        ranks = np.argsort(totals, axis=1, kind="stable")
        real = items >= 0
        out[items[real]] = ranks[real]
        add = np.where(real, cost[np.maximum(items, 0)], 0)
        np.add.at(totals, (np.repeat(rows, world), ranks.reshape(-1)), add.reshape(-1))
    return out


class ShapeStream:
    """The batches by shape of ``num_samples`` samples under ``seed`` (see the module).

    Args:
        buckets: each sample's bucket (compact ids from :func:`bucket_ids`), or None: one bucket.
        batch_size: ``B`` of a stream by count (None: by budget).
        max_cost: the budget of a stream by budget (None: by count).
        cost: each sample's integer cost (>= 0), with ``max_cost``.

    Raises:
        ValueError: both or neither of ``batch_size`` and ``max_cost``; a cost array of another length, negative
            or not integer; a sample costlier than ``max_cost`` (naming it).
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
        ids = np.zeros(n, np.int64) if buckets is None else np.asarray(buckets, np.int64)
        if ids.shape != (n,):
            raise ValueError(f"buckets must hold one id per sample ({n}), got shape {ids.shape}")
        self.buckets = ids
        self.sizes = np.bincount(ids)  # n_b
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)))
        if (batch_size is None) == (max_cost is None):
            raise ValueError("give a global batch size or a max_cost (with cost), not both nor neither")
        self.batch_size = None if batch_size is None else check_int("global_batch_size", batch_size, low=1)
        self.max_cost = None if max_cost is None else check_int("max_cost", max_cost, low=1)
        self.cost: npt.NDArray[np.int64] | None = None
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
            self.cost = c
        elif cost is not None:
            raise ValueError("cost is for a stream by budget: give max_cost with it")
        self._tables: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        self._runs: dict[int, int] = {0: 0}  # epoch -> runs before it (by budget)
        empty = np.empty(0, np.int64)
        self._share: tuple[tuple[int, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = ((), (empty, empty))
        digest = hashlib.sha256(ids.tobytes())
        digest.update(repr((self.batch_size, self.max_cost)).encode())
        if self.cost is not None:
            digest.update(self.cost.tobytes())
        self.digest = digest.hexdigest()[:16]

    def _by_bucket(self, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Epoch ``epoch``'s order (the sample at each draw) and its draws grouped by bucket, in draw order
        within each."""
        order = permute(self.num_samples, self.seed, epoch, np.arange(self.num_samples, dtype=np.int64))
        return order, np.argsort(self.buckets[order], kind="stable").astype(np.int64)

    def table(self, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The batches completed in ``epoch``, in step order: ``(ends, members, offsets)``, the draw (within
        the epoch) of each batch's last sample, and the batches' samples as global draws, batch ``i`` being
        ``members[offsets[i]:offsets[i+1]]``. The last two epochs' tables are kept."""
        if epoch in self._tables:
            return self._tables[epoch]
        n, base = self.num_samples, epoch * self.num_samples
        order, grouped = self._by_bucket(epoch)
        bucket = np.repeat(np.arange(self.sizes.size), self.sizes)  # bucket of each grouped entry
        if self.batch_size is not None:
            size = self.batch_size
            j = epoch * self.sizes[bucket] + (np.arange(n) - self.starts[bucket])  # index of the sample in its bucket
            done = np.flatnonzero(j % size == size - 1)
            ends = grouped[done]
            step_order = np.argsort(ends, kind="stable")
            ends, done = ends[step_order], done[step_order]
            first = (j[done] - (size - 1))[:, None] + np.arange(size)[None, :]  # members' indices in their bucket
            b = bucket[done][:, None]
            members = self._draws_of(b, first, epoch, grouped).reshape(-1)
            offsets = np.arange(ends.size + 1, dtype=np.int64) * size
        else:
            ends, members, offsets = self._budget_runs(grouped, bucket, order)
            members += base
            if epoch in self._runs:
                self._runs[epoch + 1] = self._runs[epoch] + ends.size
        table = ends, members, offsets
        self._tables = {e: t for e, t in self._tables.items() if e == epoch - 1}
        self._tables[epoch] = table
        return table

    def _draws_of(
        self, b: npt.NDArray[np.int64], j: npt.NDArray[np.int64], epoch: int, grouped: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """The global draws of the ``j``-th samples (in the stream) of buckets ``b`` (runs ending in ``epoch``)."""
        sizes = self.sizes[b]
        ep, r = np.divmod(j, sizes)
        out = np.empty(j.shape, np.int64)
        for e in np.unique(ep).tolist():
            where = ep == e
            rows = grouped if e == epoch else self._by_bucket(e)[1]
            bb = np.broadcast_to(b, j.shape)[where]
            out[where] = rows[self.starts[bb] + r[where]] + e * self.num_samples
        return out

    def _budget_runs(
        self, grouped: npt.NDArray[np.int64], bucket: npt.NDArray[np.int64], order: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The greedy runs of one epoch (see the module): ``(ends, members, offsets)`` as :meth:`table`, the
        members as draws within the epoch. One ``searchsorted`` per run."""
        assert self.cost is not None and self.max_cost is not None
        n = self.num_samples
        cum = np.concatenate(([0], np.cumsum(self.cost[order[grouped]])))
        limit = self.max_cost
        cuts = []
        ends_of_bucket = self.starts[1:]
        i = 0
        while i < n:
            stop = int(ends_of_bucket[bucket[i]])
            j = int(np.searchsorted(cum, cum[i] + limit, side="right")) - 1
            i = min(j, stop)
            cuts.append(i)
        bounds = np.concatenate(([0], np.asarray(cuts, np.int64)))
        ends = grouped[bounds[1:] - 1]
        step_order = np.argsort(ends, kind="stable")
        lengths = np.diff(bounds)[step_order]
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        firsts = bounds[:-1][step_order]
        idx = np.repeat(firsts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        return ends[step_order], grouped[idx], offsets

    def steps_before(self, epoch: int) -> int:
        """The global batches completed before ``epoch`` (by budget: the run counts of the epochs before it,
        from the nearest epoch known, see :meth:`anchor`)."""
        if self.batch_size is not None:
            return int(np.sum(epoch * self.sizes // self.batch_size))
        known = max(e for e in self._runs if e <= epoch)
        for e in range(known, epoch):
            self._runs[e + 1] = self._runs[e] + self.table(e)[0].size
        return self._runs[epoch]

    def anchor(self, epoch: int, steps_before: int) -> None:
        """Record that ``steps_before`` batches precede ``epoch`` (from a resume state)."""
        self._runs[check_int("epoch", epoch, low=0)] = check_int("steps", steps_before, low=0)

    def anchor_of(self, step: int) -> tuple[int, int] | None:
        """By budget, the latest epoch known to start at or before ``step`` and the batches before it: what a
        resume state keeps so that a resume does not replay the epochs (None by count: not needed)."""
        if self.batch_size is not None:
            return None
        epoch = max(e for e, s in self._runs.items() if s <= step)
        return epoch, self._runs[epoch]

    def epoch_of(self, step: int) -> int:
        """The epoch in which global batch ``step`` is completed."""
        if self.batch_size is not None:
            per = float(self.num_samples) / self.batch_size
            e = max(0, int(step / per) - 1)
            while self.steps_before(e + 1) <= step:
                e += 1
            while e and self.steps_before(e) > step:
                e -= 1
            return e
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
        _, members, offsets = self.table(epoch)
        lo, hi = int(offsets[first - base]), int(offsets[stop - base])
        draws, off = members[lo:hi], offsets[first - base : stop - base + 1] - lo
        if self.batch_size is not None:
            self.check(world)
            block = self.batch_size // world
            steps = draws.reshape(stop - first, self.batch_size)
            mine = steps[:, rank * block : (rank + 1) * block].reshape(-1)
            return mine, np.full(stop - first, block, np.int64)
        assert self.cost is not None
        lengths = np.diff(off)
        short = np.flatnonzero(lengths < world)
        if short.size:
            t = first + int(short[0])
            raise ValueError(
                f"global batch {t} holds {int(lengths[short[0]])} samples within max_cost={self.max_cost}, fewer "
                f"than the {world} ranks: each rank needs one (a smaller world size, a larger max_cost or "
                "coarser buckets)"
            )
        samples = _samples(draws, self.num_samples, self.seed)
        ranks = split_by_cost(self.cost[samples], off, world)
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
        """``(epoch, m)``: the window holding the last draw of global batch ``step``."""
        epoch = self.epoch_of(step)
        ends = self.table(epoch)[0]
        width = -(-self.num_samples // mini_epoch)
        return epoch, int(ends[step - self.steps_before(epoch)]) // width

    def steps_of(self, mini_epoch: int, epoch: int, mini_epoch_idx: int) -> tuple[int, int]:
        """The steps ``[first, stop)`` whose last draw lies in window ``(epoch, mini_epoch_idx)``."""
        width = -(-self.num_samples // mini_epoch)
        lo, hi = min(mini_epoch_idx * width, self.num_samples), min((mini_epoch_idx + 1) * width, self.num_samples)
        ends = self.table(epoch)[0]
        base = self.steps_before(epoch)
        return base + int(np.searchsorted(ends, lo)), base + int(np.searchsorted(ends, hi))


def _samples(draws: npt.NDArray[np.int64], num_samples: int, seed: int) -> npt.NDArray[np.int64]:
    """The samples at global draws ``draws`` (``aug_repeats`` 1)."""
    return stream_samples(draws, num_samples, seed)


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
        bounds = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
        return _samples(np.concatenate(parts), num_samples, seed), bounds

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
        return _samples(epoch * num_samples + positions, num_samples, seed)
