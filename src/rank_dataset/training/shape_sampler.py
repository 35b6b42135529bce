"""BucketBatchSampler: batches of one bucket each (aspect-ratio groups, resolution buckets) in the epoch layout.

Which items make a rank's batches is :mod:`rank_dataset.plan.bucket_batches`: a function of the plan and the
buckets, the same number of batches on every rank. This module hands them to a DataLoader, one pass of the
dataset's shard channel per shard, and keeps the resume point.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from rank_dataset.core.checks import check_int
from rank_dataset.plan.bucket_batches import BucketBatches, bucket_batches, bucket_counts, equal_batch_count
from rank_dataset.plan.resume import ResumeState
from rank_dataset.plan.shapes import bucket_ids
from rank_dataset.shards.channel import pass_of
from rank_dataset.training.dataset import RankDataset

__all__ = ["BucketBatchSampler"]

_KEY = "bucket_batches"  # the key of this sampler's part of its state


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of ``batch_size`` items of one bucket each, over a RankDataset's shard in the epoch layout.

    Walking the rank's shard (its share of the epoch's global order, in order), an item joins its bucket's buffer,
    and a full buffer is the next batch: detectron2's and mmdet's aspect-ratio grouping, but fixed by ``(seed,
    epoch)`` and the buckets, whatever the DataLoader's workers. Every rank yields the same number of batches in a
    mini-epoch (each rank computes every rank's bucket counts from the plan: no collective): with ``drop_last``
    (the default) the fewest full batches any rank has; the items of a rank's other batches and of its buckets'
    partial buffers are not read this mini-epoch (the next epoch's order draws them anew). Without ``drop_last``
    each rank also yields its partial batches (one per bucket, smaller), and a rank with fewer batches than the
    most any rank has repeats its first ones.

    Use it as ``DataLoader(ds, batch_sampler=BucketBatchSampler(ds, 16, bucket_by=groups))`` and call
    ``ds.set_epoch(e)`` each epoch, as with the other samplers. For the same batches on any world size, and a
    bucket's partial buffer carried into the next epoch rather than dropped, use
    ``StepSampler(ds, B, bucket_by=...)`` (the step layout).

    Args:
        dataset: a RankDataset of meta files (not a mix, without ``exclude=``, ``on_error="raise"``).
        batch_size: items of each batch, at least 1.
        bucket_by: each sample's bucket: the dict ``group_by`` returns (key -> sample numbers) or an int array of
            the ``N`` samples (e.g. ``aspect_ratio_groups(*sizes_of(meta))``).
        drop_last: drop what does not make a full batch (see above).

    ``state_dict()`` and ``load_state_dict()`` resume mid-mini-epoch on the same world size (the batches a rank
    yields depend on its shard); a resume on another world size is refused with a ValueError.

    Raises:
        TypeError: ``dataset`` is not a RankDataset.
        ValueError: a mix, ``exclude=``, ``on_error="replace"``, a dataset in the step layout, or ``bucket_by``
            not of the dataset's samples.

    Examples:
        >>> import tempfile, os
        >>> from rank_dataset import RankDataset
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"{i}.jpg {i % 2}\\n" for i in range(10)))
        >>> ds = RankDataset(p, rank=0, world_size=1)
        >>> batches = list(BucketBatchSampler(ds, 2, bucket_by=np.arange(10) % 2))
        >>> len(batches), all(len({int(ds.indices[i]) % 2 for i in b}) == 1 for b in batches)
        (4, True)
    """

    def __init__(self, dataset: RankDataset, batch_size: int, *, bucket_by: Any, drop_last: bool = True) -> None:
        if not isinstance(dataset, RankDataset):
            raise TypeError(f"dataset must be a RankDataset, got {type(dataset).__name__}")
        book = dataset._book
        if book.mixture is not None or book.exclusion_fingerprint is not None:
            raise ValueError(
                "BucketBatchSampler takes the buckets of a dataset's samples: not a mix nor exclude= (group the "
                "samples you keep into buckets of their own)"
            )
        if book.policy.on_error == "replace":
            raise ValueError("BucketBatchSampler does not take on_error='replace': use on_error='raise'")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
        self.dataset = dataset
        self.batch_size = check_int("batch_size", batch_size, low=1)
        self.drop_last = drop_last
        ids = bucket_ids(bucket_by, dataset.num_samples)
        self.num_buckets = int(ids.max()) + 1
        # The smallest dtype that holds the ids: N of them are kept.
        self.buckets: npt.NDArray[np.integer[Any]] = ids.astype(np.min_scalar_type(self.num_buckets - 1))
        self._plan: tuple[Any, BucketBatches] | None = None
        self._skip = 0  # batches of the current shard a resume skips
        self._yielded = 0

    def _batches(self) -> BucketBatches:
        spec = self.dataset.spec
        if spec.steps is not None:
            raise ValueError("the dataset is in the step layout (a StepSampler's): use StepSampler(bucket_by=...)")
        if self._plan is None or self._plan[0] != spec:
            counts = bucket_counts(spec, self.buckets, self.num_buckets)
            count = equal_batch_count(counts, self.batch_size, self.drop_last)
            mine = self.buckets[self.dataset.indices]
            self._plan = spec, bucket_batches(mine, self.batch_size, count, self.drop_last)
        return self._plan[1]

    def __len__(self) -> int:
        return len(self._batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        start, self._skip = self._skip, 0
        draws = int(batches.offsets[-1] - batches.offsets[min(start, len(batches))])
        with pass_of(self.dataset, draws=draws):
            self._yielded = start
            for i in range(start, len(batches)):
                batch = batches.batch(i).tolist()
                self._yielded = i + 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        """The resume point after the batches handed out so far in the current shard: a small dict."""
        shard = self.dataset.state_dict(consumed=0)
        return {_KEY: {"shard": shard, "batches": self._yielded, "world_size": self.dataset.world_size}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Skip the batches ``state`` says were handed out, in the same shard on the same world size.

        Raises:
            ValueError: a state of another sampler, shard (epoch, mini-epoch, plan) or world size.
        """
        own = state.get(_KEY) if isinstance(state, Mapping) else None
        if not isinstance(own, Mapping) or not {"shard", "batches", "world_size"} <= set(own):
            raise ValueError(f"not a BucketBatchSampler state (no {_KEY!r} with shard, batches and world_size)")
        saved = ResumeState.from_dict(own["shard"])
        current = ResumeState.from_dict(self.dataset.state_dict(consumed=0))
        if not saved.same_shard(current):
            raise ValueError(
                "this state is for another epoch, mini-epoch or plan than the dataset's current shard: call "
                "dataset.set_epoch(epoch, mini_epoch_idx) for the saved one first"
            )
        if own["world_size"] != self.dataset.world_size:
            raise ValueError(
                f"this state was taken on {own['world_size']} ranks and this job has {self.dataset.world_size}: "
                "bucket batches of the epoch layout resume on the same world size (StepSampler's resume on any)"
            )
        self._skip = check_int("batches", own["batches"], low=0)
