"""RandomSampler: a seeded, per-epoch shuffle of a rank's own shard."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from rank_dataset.core.checks import check_int
from rank_dataset.plan.permutation import hash_keys, permute
from rank_dataset.shards.channel import pass_of
from rank_dataset.training.dataset import ShardedDataset

__all__ = ["RandomSampler", "ResumableSampler", "find_resume_state"]

_CHUNK = 1 << 10  # indices turned into Python ints at a time (about 40 KiB of them: pages the rank touches)


class RandomSampler(Sampler[int]):
    """Every index of ``data_source`` once per epoch, in an order fixed by ``(seed, epoch)``.

    The shard itself is already a shuffled slice of the data, so the sampler only needs to shuffle
    within it; unlike ``DistributedSampler`` it does not shard again. Over a RankDataset (or
    RankServerDataset) each iteration marks the start of a pass, so that one DataLoader, with
    persistent workers or not, serves every shard ``set_epoch`` loads, each pass reading the shard
    that was current when it started.

    The order is a keyed permutation computed position by position (the plan's), drawn a thousand indices at a
    time: the training process never holds the whole shard's order.

    Args:
        data_source: a sized dataset (usually a RankDataset).
        seed: selects the order, with the epoch.

    Examples:
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
        n = len(self.data_source)
        return self._chunk(n, 0, n)

    def _chunk(self, n: int, lo: int, hi: int) -> np.ndarray:
        # Positions lo..hi-1 of the order: the plan's permutation (a bijection computed position by position),
        # keyed apart from the plan's by the sampler's own constant.
        if hi <= lo:
            return np.empty(0, np.int64)
        return permute(n, hash_keys(self.seed, 0x52414E4B), self.epoch, np.arange(lo, hi, dtype=np.int64))

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        with pass_of(self.data_source, draws=n):
            # A chunk of the order at a time, never the whole: a shard of N / W samples would hold 4 to 8 bytes
            # each in the training process for the whole pass.
            for lo in range(0, n, _CHUNK):
                yield from self._chunk(n, lo, min(lo + _CHUNK, n)).tolist()

    def __len__(self) -> int:
        return len(self.data_source)


class ResumableSampler(Sampler[int]):
    """Reads a shard in order, and knows how far: the resume point as torchdata understands it.

    The shard is already a shuffled slice of the data (a fresh one each epoch), so reading it in
    order loses no randomness, and "``k`` samples consumed" means exactly ``indices[:k]`` on every
    rank: the first ``k * world_size`` positions of the mini-epoch.

    ``state_dict()`` is the dataset's resume point (:meth:`RankDataset.state_dict`) after the samples
    this sampler has handed out; torchdata's ``StatefulDataLoader`` stores it with its own state,
    taken at the batch last returned. To resume (on any world size), hand the loader's saved state
    to :func:`find_resume_state` and that to the new dataset's ``load_state_dict`` before building the
    loader; ``loader.load_state_dict(saved)`` may then be called too (it changes nothing more).

    Examples:
        >>> import tempfile, os
        >>> from rank_dataset import RankDataset
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"{i}.jpg {i}\\n" for i in range(10)))
        >>> ds = RankDataset(p, rank=0, world_size=1)
        >>> sampler = ResumableSampler(ds)
        >>> it = iter(sampler); _ = [next(it) for _ in range(4)]
        >>> sampler.state_dict()["consumed"]
        4
    """

    def __init__(self, data_source: ShardedDataset) -> None:
        if not isinstance(data_source, ShardedDataset):
            raise TypeError(f"data_source must be a RankDataset or RankServerDataset, got {type(data_source).__name__}")
        self.data_source = data_source
        self._next = 0  # the position the next iteration starts at
        self._yielded = 0

    def __iter__(self) -> Iterator[int]:
        start, self._next = self._next, 0
        with pass_of(self.data_source, draws=max(0, len(self.data_source) - start)):
            self._yielded = start
            for i in range(start, len(self.data_source)):
                self._yielded = i + 1
                yield i

    def __len__(self) -> int:
        return len(self.data_source)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's resume point after the samples handed out so far."""
        return self.data_source.state_dict(consumed=min(self._yielded, len(self.data_source)))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Skip what ``state`` says was consumed, unless the dataset was resumed from it already."""
        from rank_dataset.plan.resume import ResumeState  # on first use: a plain pass plans no resume (nor mix)

        saved = ResumeState.from_dict(state)
        current = ResumeState.from_dict(self.data_source.state_dict(consumed=0))
        if not saved.same_shard(current):
            raise ValueError(
                "this resume state is for another epoch, mini-epoch or plan than the dataset's current shard: "
                "call dataset.load_state_dict(find_resume_state(saved_loader_state)) before building the DataLoader"
            )
        same_plan = saved.plan_world_size == current.plan_world_size
        if same_plan and saved.consumed_positions == current.consumed_positions:
            self._next = 0  # the dataset was loaded with this state: its shard starts there
        elif same_plan and saved.world_size == current.world_size and saved.consumed is not None:
            self._next = min(saved.consumed, len(self.data_source))  # same plan: skip what was read
        else:
            raise ValueError(
                f"this resume state was taken on {saved.world_size} ranks and this job has "
                f"{current.world_size}: call dataset.load_state_dict(find_resume_state(saved_loader_state)) "
                "before building the DataLoader, so that the rest of the mini-epoch is spread over the new ranks"
            )


def find_resume_state(loader_state: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset's resume point, found inside a torchdata ``StatefulDataLoader`` state dict.

    Raises:
        ValueError: no ResumableSampler state in it.
    """
    from rank_dataset.plan.resume import find_state

    found = find_state(loader_state)
    if found is None:
        raise ValueError("no rank_dataset resume state in this loader state: was the sampler a ResumableSampler?")
    return found
