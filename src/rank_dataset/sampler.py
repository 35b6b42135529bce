"""RandomSampler: a seeded, per-epoch shuffle of a rank's own shard."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import numpy as np
from torch.utils.data import Sampler

from rank_dataset._checks import check_int

__all__ = ["RandomSampler"]

_CHUNK = 1 << 16


class RandomSampler(Sampler[int]):
    """Every index of ``data_source`` once per epoch, in an order fixed by ``(seed, epoch)``.

    The shard itself is already a shuffled slice of the data, so the sampler only needs to shuffle
    within it; unlike ``DistributedSampler`` it does not shard again.

    Args:
        data_source: a sized dataset (usually a RankDataset).
        seed: selects the order, with the epoch.

    Example:
        >>> s = RandomSampler(range(5), seed=1)
        >>> s.set_epoch(3)
        >>> sorted(s) == [0, 1, 2, 3, 4] and list(s) == list(s)
        True
    """

    def __init__(self, data_source: Sized, seed: int = 0) -> None:
        if not hasattr(data_source, "__len__"):
            raise TypeError(f"data_source must have a length, got {type(data_source).__name__}")
        self.data_source = data_source
        self.seed = check_int("seed", seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on."""
        self.epoch = check_int("epoch", epoch, low=0)

    def order(self) -> np.ndarray:
        """The whole order of the current epoch as an int64 array."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, self.epoch, 0x52414E4B])
        return rng.permutation(len(self.data_source))

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        for lo in range(0, order.size, _CHUNK):
            yield from order[lo : lo + _CHUNK].tolist()

    def __len__(self) -> int:
        return len(self.data_source)
