"""The sharding plan: which samples each rank reads, in which order. Pure: no I/O, no torch.

Layout (train): ``N`` samples, ``W`` ranks, ``M`` mini-epochs, ``R = ceil(N / (W * M))`` samples per
rank and mini-epoch, ``T = R * W * M``. The epoch order is the permutation ``P`` of ``(seed, epoch)``
extended to ``T`` positions by wrapping (position ``p`` holds ``P[p mod N]``). Mini-epoch ``m`` covers
positions ``[m*R*W, (m+1)*R*W)`` and rank ``r`` takes ``m*R*W + r + k*W`` for ``k = 0..R-1``.

Layout (eval): no shuffle, no padding; rank ``r`` takes one contiguous ascending block, block sizes
differing by at most one, the blocks in rank order being ``0..N-1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rank_dataset._checks import check_int
from rank_dataset.permutation import permute

__all__ = ["ShardSpec", "epoch_order", "eval_range", "spread_positions"]


def spread_positions(start: int, stop: int, world_size: int, rank: int) -> npt.NDArray[np.int64]:
    """Deal the positions ``[start, stop)`` round-robin over ``world_size`` ranks; return ``rank``'s.

    Every rank gets ``ceil((stop - start) / world_size)`` positions: ``start + rank + k * world_size``,
    a position past ``stop`` wrapping back to the start of the range, so ranks stay equally long.

    Example:
        >>> spread_positions(0, 10, 4, 3).tolist()
        [3, 7, 1]
    """
    size = stop - start
    if size <= 0:
        raise ValueError(f"empty range [{start}, {stop})")
    count = -(-size // world_size)
    offsets = np.arange(count, dtype=np.int64)
    offsets *= world_size
    offsets += rank
    if offsets[-1] >= size:
        offsets %= size
    offsets += start
    return offsets


def eval_range(num_samples: int, world_size: int, rank: int) -> tuple[int, int]:
    """The contiguous block ``[start, stop)`` of samples that ``rank`` reads in eval mode.

    Example:
        >>> [eval_range(10, 4, r) for r in range(4)]
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass(frozen=True)
class ShardSpec:
    """Everything that fixes one rank's shard; validated on construction.

    Args:
        num_samples: ``N``, the number of samples in the meta files.
        world_size: ``W``, at least 1.
        rank: in ``[0, world_size)``.
        is_test: eval layout (contiguous, unshuffled, unpadded) instead of the train layout.
        mini_epoch: ``M``, at least 1; ignored in eval mode.
        mini_epoch_idx: in ``[0, mini_epoch)``.
        seed: selects the permutation, with ``epoch``.
        epoch: any integer >= 0.

    Example:
        >>> ShardSpec(num_samples=10, world_size=2, rank=1, seed=3).indices().shape
        (5,)
    """

    num_samples: int
    world_size: int
    rank: int
    is_test: bool = False
    mini_epoch: int = 1
    mini_epoch_idx: int = 0
    seed: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, low=1)
        check_int("world_size", self.world_size, low=1)
        check_int("rank", self.rank, low=0, high=self.world_size, high_name="world_size")
        check_int("mini_epoch", self.mini_epoch, low=1)
        check_int("mini_epoch_idx", self.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch")
        check_int("seed", self.seed)
        check_int("epoch", self.epoch, low=0)
        if not isinstance(self.is_test, bool):
            raise TypeError(f"is_test must be a bool, got {self.is_test!r}")

    @property
    def per_rank(self) -> int:
        """``R``: samples per rank in each mini-epoch (train layout)."""
        return -(-self.num_samples // (self.world_size * self.mini_epoch))

    @property
    def mini_epoch_span(self) -> tuple[int, int]:
        """The positions ``[start, stop)`` of the epoch order that this mini-epoch covers."""
        width = self.per_rank * self.world_size
        return self.mini_epoch_idx * width, (self.mini_epoch_idx + 1) * width

    def indices(self) -> npt.NDArray[np.int64]:
        """The sample numbers of this rank's shard, in the order it reads them."""
        if self.is_test:
            start, stop = eval_range(self.num_samples, self.world_size, self.rank)
            return np.arange(start, stop, dtype=np.int64)
        positions = spread_positions(*self.mini_epoch_span, self.world_size, self.rank)
        return epoch_order(self.num_samples, self.seed, self.epoch, positions)


def epoch_order(num_samples: int, seed: int, epoch: int, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The samples at ``positions`` of the epoch order (``P`` extended by wrapping past ``N``)."""
    if positions.size and int(positions.max()) >= num_samples:
        positions = positions % num_samples
    return permute(num_samples, seed, epoch, positions)
