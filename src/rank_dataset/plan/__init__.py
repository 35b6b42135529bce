"""What each rank reads, and in what order: pure numpy functions of ``(n, seed, epoch)``, no I/O.

The permutation, the shard plan (:class:`ShardSpec`), mixes of sources, subsets, class balancing,
steps, resume points and the reload config.

Example:
    >>> from rank_dataset.plan import ShardSpec
    >>> ShardSpec(10, world_size=2, rank=1, seed=0).indices().size
    5
"""

from __future__ import annotations

from rank_dataset.plan.permutation import permute
from rank_dataset.plan.spec import MAX_WORLD_SIZE, ResumePoint, ShardSpec, eval_range, spread_positions

__all__ = ["MAX_WORLD_SIZE", "ResumePoint", "ShardSpec", "eval_range", "permute", "spread_positions"]
