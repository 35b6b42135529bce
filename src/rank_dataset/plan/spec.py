"""The sharding plan: which samples each rank reads, in which order.

Layout (train): ``N`` samples, ``W`` ranks, ``M`` mini-epochs, ``R = ceil(N / (W * M))`` samples per
rank and mini-epoch, ``T = R * W * M``. The epoch order is the permutation ``P`` of ``(seed, epoch)``
extended to ``T`` positions by wrapping (position ``p`` holds ``P[p mod N]``). Mini-epoch ``m`` covers
positions ``[m*R*W, (m+1)*R*W)`` and rank ``r`` takes ``m*R*W + r + k*W`` for ``k = 0..R-1``.

Layout (eval): no shuffle, no padding; rank ``r`` takes one contiguous ascending block, block sizes
differing by at most one, the blocks in rank order being ``0..N-1``.

Repeated augmentation (``aug_repeats = k``): position ``p`` holds draw ``p // k``, so an epoch of ``N``
positions holds ``D = ceil(N / k)`` draws, the last one cut short if ``k`` does not divide ``N``. The
draws of epoch ``e`` are positions ``[e*D, (e+1)*D)`` of the file's endless stream of passes (pass ``j``
the permutation of ``(seed, j)``), so ``k`` consecutive epochs draw every sample once. With ``k = 1``
the stream position of ``p`` is ``e*N + p``, pass ``e``: the order above. As ``k`` divides
``R * W`` whenever it divides ``W``, the ``k`` copies of a draw then sit on ``k`` consecutive ranks at
the same position of their shards.

A mix of several sources (:class:`~rank_dataset.plan.mix.MixPlan`) changes only what a position holds: the
layout is the same over its ``T0`` positions, and position ``p`` holds ``mix.epoch_order(seed, epoch, p)``
instead of ``P[p mod N]`` (``mix.epoch_order(seed, epoch, p, k)`` with repeated augmentation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import MAX_EXACT, check_at_most, check_int
from rank_dataset.plan.permutation import permute, permute_stream

if TYPE_CHECKING:  # imported where a spec has a mix or a step layout: a DataLoader worker of plain files never does
    from rank_dataset.plan.mix import MixPlan
    from rank_dataset.plan.steps import StepLayout

__all__ = [
    "MAX_WORLD_SIZE",
    "ResumePoint",
    "ShardSpec",
    "epoch_order",
    "eval_range",
    "mini_epoch_width",
    "spread_positions",
]

#: The largest world size a plan accepts: far beyond any job, small enough to plan on one rank.
MAX_WORLD_SIZE = 1 << 20


def spread_positions(start: int, stop: int, world_size: int, rank: int) -> npt.NDArray[np.int64]:
    """Deal the positions ``[start, stop)`` round-robin over ``world_size`` ranks; return ``rank``'s.

    Every rank gets ``ceil((stop - start) / world_size)`` positions: ``start + rank + k * world_size``,
    a position past ``stop`` wrapping back to the start of the range, so ranks stay equally long.

    Examples:
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


def mini_epoch_width(num_samples: int, world_size: int, mini_epoch: int) -> int:
    """``R * W``: the positions of one mini-epoch, ``R = ceil(N / (W * M))`` samples per rank.

    Examples:
        >>> mini_epoch_width(10, 4, 2)
        8
    """
    return -(-num_samples // (world_size * mini_epoch)) * world_size


def eval_range(num_samples: int, world_size: int, rank: int) -> tuple[int, int]:
    """The contiguous block ``[start, stop)`` of samples that ``rank`` reads in eval mode.

    Examples:
        >>> [eval_range(10, 4, r) for r in range(4)]
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass(frozen=True)
class ResumePoint:
    """Where an interrupted epoch resumes: its plan's boundaries and how far it had got.

    Args:
        plan_world_size: the world size of the plan the epoch started with (>= 1). Its mini-epochs
            keep that plan's boundaries (``R0 * W0`` positions each), spread over the current ranks.
        mini_epoch_idx: the mini-epoch that was interrupted.
        offset: how many positions of that mini-epoch were consumed before the interruption; its
            shards cover the rest, ``[start + offset, stop)``.
    """

    plan_world_size: int
    mini_epoch_idx: int
    offset: int

    def __post_init__(self) -> None:
        check_at_most("plan_world_size", check_int("plan_world_size", self.plan_world_size, low=1), MAX_WORLD_SIZE)
        check_int("resume mini_epoch_idx", self.mini_epoch_idx, low=0)
        check_int("resume offset", self.offset, low=0)


@dataclass(frozen=True)
class ShardSpec:
    """Everything that fixes one rank's shard; validated on construction.

    Args:
        num_samples: ``N``, the number of samples in the meta files; for a mix, its epoch size
            ``T0`` (``mix.epoch_size``), the number of positions the layout covers.
        world_size: ``W``, at least 1.
        rank: in ``[0, world_size)``.
        is_test: eval layout (contiguous, unshuffled, unpadded) instead of the train layout.
        mini_epoch: ``M``, at least 1; ignored in eval mode.
        mini_epoch_idx: in ``[0, mini_epoch)``.
        seed: selects the permutation, with ``epoch``.
        epoch: any integer >= 0.
        resume: for an epoch resumed after an interruption, where it resumes (None: not resumed).
        mix: for a mix of sources, its plan (None: the plain order of ``N`` samples). Position ``p``
            then holds ``mix.epoch_order(seed, epoch, p)``, a global sample number in
            ``[0, mix.num_samples)``; in eval mode the mix must take every sample once (as
            RankDataset builds it), so an eval shard is again a contiguous block of them.
        aug_repeats: ``k``, repeated augmentation: each draw occupies ``k`` consecutive positions of
            the epoch order (an int >= 1; 1: none). Train layout only.
        steps: the step layout (:class:`~rank_dataset.plan.steps.StepLayout`, what a StepSampler loads): the
            mini-epoch is then a window of the step stream and the shard this rank's blocks of its global
            batches (None: the layout above).

    Examples:
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
    resume: ResumePoint | None = None
    mix: MixPlan | None = None
    aug_repeats: int = 1
    steps: StepLayout | None = None

    def __post_init__(self) -> None:
        check_at_most("num_samples", check_int("num_samples", self.num_samples, low=1), MAX_EXACT - 1)
        check_at_most("world_size", check_int("world_size", self.world_size, low=1), MAX_WORLD_SIZE)
        check_int("rank", self.rank, low=0, high=self.world_size, high_name="world_size")
        check_at_most("mini_epoch", check_int("mini_epoch", self.mini_epoch, low=1), MAX_EXACT - 1)
        check_int("mini_epoch_idx", self.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch")
        check_int("seed", self.seed)
        check_int("epoch", self.epoch, low=0)
        if not isinstance(self.is_test, bool):
            raise TypeError(f"is_test must be a bool, got {self.is_test!r}")
        check_at_most("aug_repeats", check_int("aug_repeats", self.aug_repeats, low=1), MAX_EXACT - 1)
        if self.is_test and self.aug_repeats != 1:
            raise ValueError(
                f"aug_repeats={self.aug_repeats} repeats training draws; eval mode (is_test=True) reads every "
                "sample once: use aug_repeats=1"
            )
        if self.mix is not None:
            from rank_dataset.plan.mix import MixPlan

            if not isinstance(self.mix, MixPlan):
                raise TypeError(f"mix must be a MixPlan or None, got {type(self.mix).__name__}")
            if self.mix.epoch_size != self.num_samples:
                raise ValueError(
                    f"num_samples must be the mix's epoch size {self.mix.epoch_size} (the positions of its order), "
                    f"got {self.num_samples}"
                )
            if self.is_test and self.mix.counts != self.mix.sizes:
                raise ValueError("an eval mix (is_test=True) takes every sample of every source once: counts == sizes")
            self.mix.check_draws(self.aug_repeats)  # a source's count too small for a draw of k copies
        if self.plan_width * self.mini_epoch >= MAX_EXACT:
            raise ValueError(
                f"mini_epoch={self.mini_epoch} is too large for {self.num_samples} samples on {self.world_size} ranks: "
                f"an epoch would span {self.plan_width * self.mini_epoch} positions (at most {MAX_EXACT - 1})"
            )
        if self.steps is not None:
            self._check_steps()
        if self.resume is not None:
            if not isinstance(self.resume, ResumePoint):
                raise TypeError(f"resume must be a ResumePoint or None, got {type(self.resume).__name__}")
            if self.is_test:
                raise ValueError("eval shards (is_test=True) cannot be resumed: they are neither shuffled nor padded")
            r = self.resume
            check_int("resume mini_epoch_idx", r.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch")
            width = self.plan_width
            if r.offset > width:
                raise ValueError(
                    f"resume offset must be in [0, {width}] (the positions of a mini-epoch), got {r.offset}"
                )

    def _check_steps(self) -> None:
        from rank_dataset.plan.steps import StepLayout

        if not isinstance(self.steps, StepLayout):
            raise TypeError(f"steps must be a StepLayout or None, got {type(self.steps).__name__}")
        if self.is_test or self.resume is not None:
            raise ValueError("the step layout is a training layout of its own: not with is_test nor a resume point")
        step_mix = self.steps.mix
        if step_mix is not None and (
            self.mix is None or (step_mix.sizes, step_mix.epoch_size) != (self.mix.sizes, self.mix.epoch_size)
        ):
            raise ValueError("a step layout's rules by step need the mix of the same sources (ShardSpec.mix)")
        self.steps.check(self.world_size, self.aug_repeats)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field; :meth:`from_dict` makes the same spec of it (``steps`` only
        when set)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["resume"] = dataclasses.asdict(self.resume) if self.resume else None
        d["mix"] = self.mix.to_dict() if self.mix else None
        if self.steps is None:
            del d["steps"]
        else:
            d["steps"] = self.steps.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardSpec:
        """The spec that :meth:`to_dict` described (``resume`` and ``mix`` may be missing: None)."""
        d = dict(data)
        resume, mix, steps = d.pop("resume", None), d.pop("mix", None), d.pop("steps", None)
        if mix:
            from rank_dataset.plan.mix import MixPlan

            mix = MixPlan.from_dict(mix)
        if steps:
            from rank_dataset.plan.steps import StepLayout

            steps = StepLayout.from_dict(steps)
        return cls(**d, resume=ResumePoint(**resume) if resume else None, mix=mix or None, steps=steps or None)

    @property
    def plan_width(self) -> int:
        """Positions per mini-epoch: ``R * W`` of the plan this epoch started with."""
        world = self.resume.plan_world_size if self.resume else self.world_size
        return mini_epoch_width(self.num_samples, world, self.mini_epoch)

    @property
    def mini_epoch_span(self) -> tuple[int, int]:
        """The positions ``[start, stop)`` of the epoch order that this shard's mini-epoch covers
        (for the interrupted mini-epoch of a resumed epoch, what was left of it)."""
        width = self.plan_width
        start, stop = self.mini_epoch_idx * width, (self.mini_epoch_idx + 1) * width
        if self.resume and self.mini_epoch_idx == self.resume.mini_epoch_idx:
            start += self.resume.offset
        return start, stop

    def positions(self) -> npt.NDArray[np.int64]:
        """The positions of the epoch order that this rank's shard reads, in order (train layout:
        a position ``>= num_samples`` is padding and holds what ``position mod num_samples`` holds;
        eval layout: the positions are the sample numbers)."""
        if self.is_test:
            start, stop = eval_range(self.num_samples, self.world_size, self.rank)
            return np.arange(start, stop, dtype=np.int64)
        if self.steps is not None:
            return self.steps.positions(
                self.num_samples,
                self.world_size,
                self.rank,
                self.mini_epoch,
                self.epoch,
                self.mini_epoch_idx,
                self.aug_repeats,
            )
        start, stop = self.mini_epoch_span
        if start == stop:  # a resumed mini-epoch that had been consumed entirely
            return np.empty(0, np.int64)
        return spread_positions(start, stop, self.world_size, self.rank)

    def indices(self) -> npt.NDArray[np.int64]:
        """The sample numbers of this rank's shard, in the order it reads them."""
        positions = self.positions()
        if self.is_test:
            return positions
        if self.steps is not None:
            return self.steps.indices(positions, self.num_samples, self.seed, self.epoch, self.aug_repeats, self.mix)
        if self.mix is not None:
            return self.mix.epoch_order(self.seed, self.epoch, positions, self.aug_repeats)
        return epoch_order(self.num_samples, self.seed, self.epoch, positions, self.aug_repeats)

    def consumed_positions(self, consumed: int) -> int:
        """Positions of this mini-epoch consumed once every rank has read ``consumed`` samples of its
        shard (counted from the start of the mini-epoch, whatever was consumed before a resume)."""
        if self.steps is not None:
            raise ValueError("a shard of the step layout resumes by step: save the StepSampler's state_dict()")
        start, stop = self.mini_epoch_span
        width = self.plan_width
        base = start - self.mini_epoch_idx * width
        # Past the end, ranks read the wrapped padding, which consumes nothing new.
        return base + min(consumed * self.world_size, stop - start)


def epoch_order(
    num_samples: int, seed: int, epoch: int, positions: npt.NDArray[np.int64], aug_repeats: int = 1
) -> npt.NDArray[np.int64]:
    """The samples at ``positions`` of the epoch order (extended by wrapping past ``N``).

    With ``aug_repeats = k > 1``, position ``p`` holds draw ``p // k``, and the ``D = ceil(N / k)``
    draws of epoch ``e`` are positions ``[e*D, (e+1)*D)`` of the stream whose pass ``j`` is the
    permutation of ``(seed, j)`` (see :func:`~rank_dataset.plan.permutation.permute_stream`); with
    ``k = 1`` that is ``P[p mod N]``, ``P`` the permutation of ``(seed, epoch)``.

    Example:
        >>> epoch_order(10, 0, 0, np.arange(4), aug_repeats=2).tolist() == [*np.repeat(permute(10, 0, 0, [0, 1]), 2)]
        True
    """
    if positions.size and int(positions.max()) >= num_samples:
        positions = positions % num_samples
    if aug_repeats == 1:
        return permute(num_samples, seed, epoch, positions)
    draws = -(-num_samples // aug_repeats)
    return permute_stream(num_samples, seed, epoch * draws, positions // aug_repeats, stop=draws)
