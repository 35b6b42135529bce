"""Batches of one bucket each over the epoch layout's shards (what ``BucketBatchSampler`` yields).

A rank's shard of a mini-epoch is its share of the epoch's global order (positions ``start + rank + k * W``,
:func:`~rank_dataset.plan.spec.spread_positions`), read in that order. Its batches are the global order's
per-bucket buffers as each rank sees them: walking its shard, an item joins its bucket's buffer, and a buffer that
reaches the batch size ``B`` is the rank's next batch (as detectron2's ``AspectRatioGroupedDataset`` fills its
buffers, but over the plan's order, so the batches do not depend on the DataLoader's workers). What is left in the
buffers at the shard's end is a partial batch per bucket.

Every rank of an epoch has the same number of batches, a function of every rank's bucket counts (which each rank
computes from the plan, without a collective): with ``drop_last`` the fewest full batches any rank has (a rank's
later full batches and its partial ones are not read this mini-epoch); without it the most batches, full and
partial, any rank has, a rank with fewer repeating its first batches (as ``DistributedSampler`` pads by
repeating). Everything is a function of the plan (seed, epoch, mini-epoch, world size) and the buckets.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums, ranges
from rank_dataset.core.checks import check_int
from rank_dataset.plan.spec import ShardSpec

__all__ = ["BucketBatches", "bucket_batches", "bucket_counts", "equal_batch_count"]


@dataclasses.dataclass(frozen=True)
class BucketBatches:
    """A rank's batches: batch ``i`` is the shard's items ``items[offsets[i]:offsets[i+1]]`` (item numbers of the
    shard, in the order the shard holds them), all of one bucket."""

    items: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def batch(self, i: int) -> npt.NDArray[np.int64]:
        return self.items[int(self.offsets[i]) : int(self.offsets[i + 1])]


def bucket_counts(spec: ShardSpec, buckets: npt.NDArray[np.integer], num_buckets: int) -> npt.NDArray[np.int64]:
    """``(W, K)``: how many items of each bucket each rank's shard of ``spec``'s mini-epoch holds (each rank's shard
    computed from the plan, so no collective is needed). ``buckets``: each sample's bucket ``0..K-1``."""
    counts = np.empty((spec.world_size, num_buckets), np.int64)
    for r in range(spec.world_size):
        ids = dataclasses.replace(spec, rank=r).indices()
        counts[r] = np.bincount(buckets[ids], minlength=num_buckets)
    return counts


def equal_batch_count(counts: npt.ArrayLike, batch_size: int, drop_last: bool) -> int:
    """The batches every rank yields, from the ranks' bucket counts ``(W, K)``: the fewest full batches of any rank
    (``drop_last``), else the most full and partial batches of any rank.

    Example:
        >>> equal_batch_count([[5, 2], [3, 3]], 2, True), equal_batch_count([[5, 2], [3, 3]], 2, False)
        (2, 4)
    """
    size = check_int("batch_size", batch_size, low=1)
    c = np.asarray(counts, np.int64)
    per_rank = (c // size).sum(axis=1) if drop_last else (-(-c // size)).sum(axis=1)
    return int(per_rank.min() if drop_last else per_rank.max())


def bucket_batches(item_buckets: npt.ArrayLike, batch_size: int, num_batches: int, drop_last: bool) -> BucketBatches:
    """A rank's ``num_batches`` batches from its shard, ``item_buckets`` each item's bucket in shard order: its full
    batches in the order they fill (by the position of their last item), then (not ``drop_last``) its partial
    batches, by bucket; cut to ``num_batches``, or repeated from the first to reach it.

    Example:
        >>> b = bucket_batches([0, 1, 0, 0, 1, 1, 0], 2, 3, drop_last=True)
        >>> [b.batch(i).tolist() for i in range(len(b))]
        [[0, 2], [1, 4], [3, 6]]
        >>> b = bucket_batches([0, 1, 0, 0, 1], 2, 4, drop_last=False)
        >>> [b.batch(i).tolist() for i in range(len(b))]
        [[0, 2], [1, 4], [3], [0, 2]]
    """
    size = check_int("batch_size", batch_size, low=1)
    wanted = check_int("num_batches", num_batches, low=0)
    ids = np.asarray(item_buckets, np.int64).reshape(-1)
    grouped = np.argsort(ids, kind="stable")  # items by bucket, in shard order within each
    sizes = np.bincount(ids) if ids.size else np.zeros(0, np.int64)
    starts = prefix_sums(sizes)[:-1]
    full = sizes // size
    # Full batch k of bucket b: grouped[starts[b] + k*B : starts[b] + (k+1)*B], complete at its last item.
    bucket_of = np.repeat(np.arange(sizes.size), full)
    k = ranges(0, full)
    firsts = starts[bucket_of] + k * size
    firsts = firsts[np.argsort(grouped[firsts + size - 1], kind="stable")]
    lengths = np.full(firsts.size, size, np.int64)
    if not drop_last:
        left = sizes - full * size
        has = np.flatnonzero(left)
        firsts = np.concatenate((firsts, starts[has] + full[has] * size))
        lengths = np.concatenate((lengths, left[has]))
    if firsts.size == 0 and wanted:
        raise ValueError(f"a shard of no batches cannot yield {wanted}")
    take = np.arange(wanted) % max(firsts.size, 1)  # cut, or repeat from the first
    firsts, lengths = firsts[take], lengths[take]
    return BucketBatches(grouped[ranges(firsts, lengths)].astype(np.int64), prefix_sums(lengths))
