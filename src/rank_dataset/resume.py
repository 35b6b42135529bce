"""The resume state: one frozen value, its format version, and every check of a loaded one. No torch.

A state names positions of the epoch order, not ranks, so it can be loaded on any world size. It is
a small JSON-serialisable dict on the wire (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rank_dataset._checks import check_int
from rank_dataset.plan import ResumePoint, ShardSpec

__all__ = ["MAX_PLAN_WORLD_SIZE", "STATE_VERSION", "ResumeState", "find_state"]

#: The format version of resume states; a state of another version is refused.
STATE_VERSION = 1
#: The largest world size a state may name: far beyond any job, small enough to plan on one rank.
MAX_PLAN_WORLD_SIZE = 1 << 20
_MAX_INT = 1 << 62  # epochs, mini-epochs and positions: a bound that keeps int64 arithmetic exact


@dataclass(frozen=True)
class ResumeState:
    """Where a run stopped: the files, the plan, and the positions of the epoch order consumed.

    Args:
        num_samples, fingerprint: the meta files the state is for (fingerprint None: unknown).
        seed, epoch, mini_epoch, mini_epoch_idx: the plan and the mini-epoch that was interrupted.
        plan_world_size: the world size that mini-epoch was planned on.
        consumed_positions: positions of that mini-epoch consumed, summed over all ranks.
        world_size, consumed: the world size the state was taken on, and samples consumed per rank
            (what a sampler on the same world size skips).
    """

    num_samples: int
    fingerprint: str | None
    seed: int
    epoch: int
    mini_epoch: int
    mini_epoch_idx: int
    plan_world_size: int
    consumed_positions: int
    world_size: int | None = None
    consumed: int | None = None

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, low=1, high=_MAX_INT)
        if self.fingerprint is not None and not isinstance(self.fingerprint, str):
            raise TypeError(f"fingerprint must be a str or None, got {self.fingerprint!r}")
        check_int("seed", self.seed, low=-_MAX_INT, high=_MAX_INT)
        check_int("epoch", self.epoch, low=0, high=_MAX_INT)
        check_int("mini_epoch", self.mini_epoch, low=1, high=_MAX_INT)
        check_int("mini_epoch_idx", self.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch")
        check_int("plan_world_size", self.plan_world_size, low=1, high=MAX_PLAN_WORLD_SIZE + 1)
        # The positions of a mini-epoch of the plan: ShardSpec.plan_width, before any spec exists.
        width = -(-self.num_samples // (self.plan_world_size * self.mini_epoch)) * self.plan_world_size
        positions = check_int("consumed_positions", self.consumed_positions, low=0)
        if positions > width:
            raise ValueError(
                f"consumed_positions must be in [0, {width}] (the positions of a mini-epoch of this plan), "
                f"got {positions}"
            )
        if self.world_size is not None:
            check_int("world_size", self.world_size, low=1, high=MAX_PLAN_WORLD_SIZE + 1)
        if self.consumed is not None:
            check_int("consumed", self.consumed, low=0, high=_MAX_INT)

    @property
    def point(self) -> ResumePoint:
        """The resume point of the interrupted epoch."""
        return ResumePoint(self.plan_world_size, self.mini_epoch_idx, self.consumed_positions)

    def apply(self, spec: ShardSpec) -> ShardSpec:
        """``spec`` (a rank's, on any world size) moved to its share of what was left of the
        interrupted mini-epoch."""
        return dataclasses.replace(
            spec,
            mini_epoch=self.mini_epoch,
            mini_epoch_idx=self.mini_epoch_idx,
            seed=self.seed,
            epoch=self.epoch,
            resume=self.point,
        )

    def check_files(self, num_samples: int, fingerprint: str | None) -> None:
        """Raise ValueError unless the state is for files with this count and fingerprint."""
        if self.num_samples != num_samples:
            raise ValueError(
                f"the resume state is for {self.num_samples} samples, but these meta files hold {num_samples}"
            )
        if self.fingerprint is not None and fingerprint is not None and self.fingerprint != fingerprint:
            raise ValueError(
                f"the resume state is for other meta files: fingerprint {self.fingerprint} != {fingerprint} "
                "(same number of samples, different contents or sizes)"
            )

    def same_shard(self, other: ResumeState) -> bool:
        """Whether both states are points within the same mini-epoch of the same plan and files."""
        keys = ("num_samples", "fingerprint", "seed", "epoch", "mini_epoch", "mini_epoch_idx")
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON-serialisable dict, with its format version."""
        return {"version": STATE_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        """The state in ``state`` (from :meth:`to_dict`), every key checked.

        Raises:
            TypeError: not a mapping, or a value of the wrong type (the message names the key).
            ValueError: another format version, a missing key, or a value out of range.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [k for k in ["version", *required] if k not in state]
        if missing:
            raise ValueError(f"not a resume state of this library: missing {', '.join(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"resume state version {state['version']!r} is unknown; this version reads {STATE_VERSION}"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in state.items() if k in fields})
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"invalid resume state: {exc}") from None


def find_state(node: Any) -> dict[str, Any] | None:
    """The first resume state dict inside a nested state (e.g. a StatefulDataLoader's), or None."""
    if isinstance(node, Mapping):
        if node.get("version") == STATE_VERSION and "consumed_positions" in node:
            return dict(node)
        for value in node.values():
            found = find_state(value)
            if found is not None:
                return found
    return None
