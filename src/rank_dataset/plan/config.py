"""ReloadConfig: the ``reload_cfg`` keys, validated."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rank_dataset.core.checks import check_int

__all__ = ["ReloadConfig"]


@dataclass(frozen=True)
class ReloadConfig:
    """How a rank's shard is cut and shuffled.

    Args:
        mini_epoch: ``M``, the number of mini-epochs each epoch is cut into (>= 1). A rank holds
            ``ceil(N / (world_size * M))`` samples at a time.
        seed: selects the shuffle, with ``epoch``; the same on every rank.
        mini_epoch_idx: which mini-epoch to load, in ``[0, mini_epoch)``.
        epoch: the epoch (>= 0); each epoch is a fresh shuffle.
        group: any int >= 1, accepted and ignored (the original rank_dataset's ``"group": 1``):
            shards are always cut over the whole world.
        epoch_size: for a mix of sources (a list of :class:`~rank_dataset.plan.sources.Source`), ``T0``, the
            samples an epoch takes of all sources together (an int >= 1); None: the sum of the fixed
            counts if no source has a weight, else the total number of samples of all sources.
            Meaningless without sources (a ValueError there); ignored in eval mode.
        aug_repeats: ``k``, repeated augmentation (an int >= 1; 1: none): each sample drawn appears
            ``k`` times in a row of the epoch order, on ``k`` consecutive ranks when ``k`` divides the
            world size; an epoch keeps its size and holds ``ceil(size / k)`` draws. Train mode only
            (``k > 1`` with ``is_test=True`` is a ValueError).

    Examples:
        >>> ReloadConfig.coerce({"mini_epoch": 2, "seed": 7})
        ReloadConfig(mini_epoch=2, seed=7, mini_epoch_idx=0, epoch=0, group=1, epoch_size=None, aug_repeats=1)
    """

    mini_epoch: int = 1
    seed: int = 0
    mini_epoch_idx: int = 0
    epoch: int = 0
    group: int = 1
    epoch_size: int | None = None
    aug_repeats: int = 1

    def __post_init__(self) -> None:
        check_int("reload_cfg['mini_epoch']", self.mini_epoch, low=1)
        check_int("reload_cfg['seed']", self.seed)
        check_int(
            "reload_cfg['mini_epoch_idx']", self.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch"
        )
        check_int("reload_cfg['epoch']", self.epoch, low=0)
        check_int("reload_cfg['group']", self.group, low=1)
        if self.epoch_size is not None:
            check_int("reload_cfg['epoch_size']", self.epoch_size, low=1)
        check_int("reload_cfg['aug_repeats']", self.aug_repeats, low=1)

    @classmethod
    def coerce(cls, value: ReloadConfig | Mapping[str, Any] | None) -> ReloadConfig:
        """A ReloadConfig from None (the defaults), a mapping of its keys, or a ReloadConfig."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"reload_cfg must be a dict, a ReloadConfig or None, got {type(value).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(known), key=str)
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown reload_cfg key {unknown[0]!r}{hint}; valid keys are {', '.join(known)}")
        return cls(**value)

    def replace(self, **changes: Any) -> ReloadConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
