"""The step stream: which positions of the epochs' orders make global batch ``t``.

The stream is the epochs' orders back to back, in *draws*: epoch ``e`` holds ``D = ceil(N / k)`` draws (``k`` the
``aug_repeats``, 1 without; ``N`` the plan's samples, for a mix its epoch size ``T0``), draw ``d`` of epoch ``e``
being what position ``d * k`` of that epoch's order holds. There is no padding: a global batch may straddle an
epoch's end, and every sample is drawn once an epoch.

Global batch ``t`` has ``B(t)`` items (the schedule ``{first_step: size}``), the stream's items ``S(t) = B(0) + ...
+ B(t-1)`` on: the draws ``[S(t)/k, (S(t) + B(t))/k)``, listed *copy-major*: item ``i`` is copy ``i // (B/k)`` of
draw ``S(t)/k + i % (B/k)``. Rank ``r`` of ``W`` takes the contiguous block ``[r*B/W, (r+1)*B/W)`` of that list.
The list does not depend on ``W``, so the ranks' blocks in rank order are the same list on any ``W`` dividing
every size; and the ``k`` copies of a draw, ``B/k`` items apart, sit on ``k`` different ranks whenever
``W >= k`` (a block is at most ``B/k`` long).

Shards (mini-epochs): epoch ``e``'s draws are cut into ``M`` windows of ``w = ceil(D / M)`` draws, a window
independent of ``W``. The shard of window ``(e, m)`` holds this rank's blocks of every step whose first draw lies
in the window, in step order: its share of the window plus the tail of the one batch that straddles its end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import MAX_EXACT
from rank_dataset.plan.permutation import permute_stream
from rank_dataset.plan.remix import RemixChain
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.step_mix import StepMix

if TYPE_CHECKING:
    from rank_dataset.plan.mix import MixPlan

__all__ = ["StepLayout", "check_stream", "draws_per_epoch", "stream_samples"]


def draws_per_epoch(num_samples: int, aug_repeats: int = 1) -> int:
    """``D = ceil(N / k)``: the draws of one epoch of the step stream."""
    return -(-num_samples // aug_repeats)


@dataclass(frozen=True)
class StepLayout:
    """The step layout of a shard (``ShardSpec.steps``): its mini-epoch ``(epoch, m)`` is a window of the step
    stream (see the module), and its items are this rank's blocks of the steps that start in it.

    Args:
        schedule: the global batch size by step.
        mix: for a mix whose rules change by step (:mod:`rank_dataset.plan.step_mix`), its rules; None: the
            stream is the epochs' orders (of the files, or of a mix by epochs).
        shapes: for batches by shape (:class:`rank_dataset.plan.shapes.ShapeLayout`, which computes them), the
            digest of their buckets and costs; a layout read back from a dict with it has no positions.
        remix: for a run whose mix was edited at a resume (:mod:`rank_dataset.plan.remix`), its chain of mixes,
            which then gives the sample of every draw (None: none).
    """

    schedule: BatchSchedule
    mix: StepMix | None = None
    shapes: str | None = None
    remix: RemixChain | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"global_batch_size": self.schedule.to_dict()}
        if self.mix is not None:
            d["mix"] = self.mix.to_dict()
        if self.shapes is not None:
            d["shapes"] = self.shapes
        if self.remix is not None:
            d["remix"] = self.remix.to_state()
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepLayout:
        mix, remix = data.get("mix"), data.get("remix")
        return cls(
            BatchSchedule.of(dict(data["global_batch_size"])),
            None if mix is None else StepMix.from_dict(mix),
            data.get("shapes"),
            None if remix is None else RemixChain.from_state(remix),
        )

    def check(self, world_size: int, aug_repeats: int = 1) -> None:
        """Raise ValueError if the world size or ``aug_repeats`` cannot read this layout (the schedule's sizes)."""
        if self.shapes is None:
            self.schedule.check(world_size, aug_repeats)

    def _positional(self) -> None:
        if self.shapes is not None:
            raise ValueError(
                "the positions of batches by shape are computed from their buckets and costs, which this layout "
                "(read back from a dict) does not hold: ask the training process's dataset"
            )

    def window_of(self, step: int, num_samples: int, mini_epoch: int, aug_repeats: int = 1) -> tuple[int, int]:
        """``(epoch, m)``: the window holding the first draw of global batch ``step``."""
        draws = draws_per_epoch(num_samples, aug_repeats)
        width = -(-draws // mini_epoch)
        epoch, d = divmod(self.schedule.start(step) // aug_repeats, draws)
        return epoch, d // width

    def steps_of(
        self, num_samples: int, mini_epoch: int, epoch: int, mini_epoch_idx: int, aug_repeats: int = 1
    ) -> tuple[int, int]:
        """The steps ``[first, stop)`` whose first draw lies in window ``(epoch, mini_epoch_idx)`` (empty if none)."""
        draws = draws_per_epoch(num_samples, aug_repeats)
        width = -(-draws // mini_epoch)
        lo = epoch * draws + min(mini_epoch_idx * width, draws)
        hi = epoch * draws + min((mini_epoch_idx + 1) * width, draws)
        return self.schedule.step_at(lo * aug_repeats), self.schedule.step_at(hi * aug_repeats)

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
        """This rank's items of window ``(epoch, mini_epoch_idx)``, in order, as positions counted from the start
        of ``epoch``: ``draw * k + copy`` (``draw`` may pass the epoch's ``D`` draws: the straddling batch)."""
        self._positional()
        k = aug_repeats
        first, stop = self.steps_of(num_samples, mini_epoch, epoch, mini_epoch_idx, k)
        base = epoch * draws_per_epoch(num_samples, k)
        parts = []
        for a, z, size, start in self.schedule.segments(first, stop):
            per, block = size // k, size // world_size
            item = np.arange(rank * block, (rank + 1) * block, dtype=np.int64)
            # Draw of item i at step u: S(u)/k + i % (B/k); S(u) = start + (u - a) * size.
            steps = np.arange(z - a, dtype=np.int64)[:, None]
            steps *= per
            steps += start // k - base
            if k == 1:
                parts.append((steps + item[None, :]).reshape(-1))
                continue
            copy, offset = np.divmod(item, per)
            draws = steps + offset[None, :]
            draws *= k
            draws += copy[None, :]
            parts.append(draws.reshape(-1))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def batch(
        self,
        step: int,
        num_samples: int,
        seed: int,
        aug_repeats: int = 1,
        mix: MixPlan | None = None,
        world_size: int = 1,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Global batch ``step`` alone, without its window: its samples (plan numbers) in global-batch order and
        where each of ``world_size`` ranks' blocks starts in it (``world_size + 1`` bounds, rank 0's block
        first). The list does not depend on ``world_size``; a size it does not divide is a ValueError."""
        self._positional()
        k = aug_repeats
        size = self.schedule.size(step)
        self.schedule.check(world_size, k)
        samples = self._samples(self.draws(step, k), num_samples, seed, k, mix)
        return samples, np.arange(world_size + 1, dtype=np.int64) * (size // world_size)

    def draws(self, step: int, aug_repeats: int = 1) -> npt.NDArray[np.int64]:
        """The stream's draw of each item of global batch ``step``, in global-batch order (copy-major)."""
        size = self.schedule.size(step)
        per = size // aug_repeats
        draws = np.arange(size, dtype=np.int64)
        draws %= per
        draws += self.schedule.start(step) // aug_repeats
        return draws

    def indices(
        self,
        positions: npt.NDArray[np.int64],
        num_samples: int,
        seed: int,
        epoch: int,
        aug_repeats: int = 1,
        mix: MixPlan | None = None,
    ) -> npt.NDArray[np.int64]:
        """The samples (plan numbers) at ``positions`` of :meth:`positions`."""
        self._positional()
        draws = epoch * draws_per_epoch(num_samples, aug_repeats) + positions // aug_repeats
        return self._samples(draws, num_samples, seed, aug_repeats, mix)

    def _samples(
        self, draws: npt.NDArray[np.int64], num_samples: int, seed: int, k: int, mix: MixPlan | None
    ) -> npt.NDArray[np.int64]:
        """The samples (plan numbers) at the stream's draws ``draws``."""
        if self.remix is not None:  # a mix edited at a resume: its chain of mixes gives every draw's sample
            return self.remix.samples(draws)
        if self.mix is not None:  # by steps: the batches' counts and slots of draws, not an epoch order
            return self.mix.samples(draws, self.schedule.in_draws(k), seed)
        return stream_samples(draws, num_samples, seed, k, mix)


def stream_samples(
    draws: npt.NDArray[np.int64], num_samples: int, seed: int, aug_repeats: int = 1, mix: MixPlan | None = None
) -> npt.NDArray[np.int64]:
    """The samples at draws ``draws`` of the step stream (draw ``q``: draw ``q mod D`` of epoch ``q // D``).

    Example:
        >>> from rank_dataset.plan.permutation import permute
        >>> stream_samples(np.arange(12), 10, 0).tolist()[10:] == permute(10, 0, 1, [0, 1]).tolist()
        True
    """
    draws = np.asarray(draws, np.int64)
    if mix is None:  # draw q is position q of the files' stream of passes (as in spec.epoch_order)
        return permute_stream(num_samples, seed, 0, draws)
    k, per_epoch = aug_repeats, draws_per_epoch(num_samples, aug_repeats)
    if not draws.size:
        return np.empty(draws.shape, np.int64)
    lo, hi = int(draws.min()) // per_epoch, int(draws.max()) // per_epoch
    if lo == hi:  # one epoch (all but the shard that straddles an epoch's end): no split
        return mix.epoch_order(seed, lo, (draws - lo * per_epoch) * k, k)
    epochs, within = np.divmod(draws, per_epoch)
    out = np.empty(within.shape, np.int64)
    for e in range(lo, hi + 1):
        where = epochs == e
        if where.any():
            out[where] = mix.epoch_order(seed, e, within[where] * k, k)
    return out


def check_stream(num_samples: int, schedule: BatchSchedule, step: int) -> None:
    """Raise ValueError if ``step``'s stream items pass the exact range of the plan's arithmetic."""
    if schedule.start(step + 1) >= MAX_EXACT - num_samples:
        raise ValueError(f"step {step} is too far: the stream of global batches would pass 2**62 positions")
