"""The resume state of a run by steps: the next global batch and what identifies the stream.

Global batch ``t`` is a function of the files, the seed, ``aug_repeats``, the mix and the batch-size schedule
(:mod:`rank_dataset.plan.steps`), never of the world size or of the mini-epoch count, so a state is the step
plus those, a small JSON dict: the same on every rank, loadable on any world size that divides the sizes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rank_dataset.core.checks import MAX_EXACT, check_int, check_record
from rank_dataset.plan.schedule import BatchSchedule

__all__ = ["STEP_STATE_KEY", "StepState", "find_nested", "find_step_state", "json_digest", "mix_digest"]

#: The key that marks a step state; its value is the format version.
STEP_STATE_KEY = "rank_dataset_steps"
_VERSION = 1
_NAMES = {
    "num_samples": "number of samples",
    "fingerprint": "files (fingerprint)",
    "seed": "seed",
    "aug_repeats": "aug_repeats",
    "mix": "mix (its sources, counts or schedules)",
    "shapes": "batches by shape (bucket_by, max_cost or cost)",
    "schedule": "global batch size schedule",
}


def json_digest(record: Any) -> str:
    """A short hash of a JSON-able value (a MixPlan's dict, a chain's state), the same wherever it is computed."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def mix_digest(record: Mapping[str, Any] | None) -> str | None:
    """:func:`json_digest` of a mix's numbers (a ``MixRecord`` as a dict): what a step state records of the mix."""
    return None if record is None else json_digest(record)


@dataclass(frozen=True)
class StepState:
    """Where a run by steps is: ``step``, the next global batch to read, and what fixes the stream.

    Args:
        step: the next global batch (>= 0).
        num_samples: the plan's samples (for a mix, its epoch size).
        fingerprint: the files' fingerprint (None: unknown).
        seed: the plan's seed.
        aug_repeats: the plan's ``k``.
        schedule: the global batch size by step.
        mix: for a mix, :func:`mix_digest` of its record (None: plain files).
        shapes: for batches by shape, the digest of their buckets and costs
            (:class:`~rank_dataset.plan.shapes.ShapeStream`; None: plain batches).
    """

    step: int
    num_samples: int
    fingerprint: str | None
    seed: int
    aug_repeats: int
    schedule: BatchSchedule
    mix: str | None = None
    shapes: str | None = None

    def __post_init__(self) -> None:
        check_int("step", self.step, low=0, high=MAX_EXACT)
        check_int("num_samples", self.num_samples, low=1, high=MAX_EXACT)
        check_int("seed", self.seed, low=-MAX_EXACT, high=MAX_EXACT)
        check_int("aug_repeats", self.aug_repeats, low=1, high=MAX_EXACT)
        for name in ("fingerprint", "mix", "shapes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"invalid step state: {name} must be a str or None, got {value!r}")
        if not isinstance(self.schedule, BatchSchedule):
            raise TypeError(f"schedule must be a BatchSchedule, got {type(self.schedule).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict, marked by :data:`STEP_STATE_KEY` (``shapes`` only when set)."""
        d = {
            STEP_STATE_KEY: _VERSION,
            "step": self.step,
            "global_batch_size": self.schedule.to_dict(),
            "seed": self.seed,
            "aug_repeats": self.aug_repeats,
            "num_samples": self.num_samples,
            "fingerprint": self.fingerprint,
            "mix": self.mix,
        }
        if self.shapes is not None:
            d["shapes"] = self.shapes
        return d

    @classmethod
    def from_dict(cls, data: Any) -> StepState:
        """The state of :meth:`to_dict`; TypeError or ValueError naming what is missing or invalid."""
        check_record(
            data,
            STEP_STATE_KEY,
            (_VERSION,),
            what="StepSampler state",
            given="a dict from StepSampler.state_dict()",
            required=("step", "global_batch_size", "seed", "num_samples"),
        )
        return cls(
            step=data["step"],
            num_samples=data["num_samples"],
            fingerprint=data.get("fingerprint"),
            seed=data["seed"],
            aug_repeats=data.get("aug_repeats", 1),
            schedule=BatchSchedule.of(data["global_batch_size"], "the state's global_batch_size"),
            mix=data.get("mix"),
            shapes=data.get("shapes"),
        )

    def check_same_stream(self, current: StepState) -> None:
        """Raise ValueError naming the first thing that differs between this (saved) state's stream and
        ``current``'s: the files, the seed, ``aug_repeats``, the mix or the schedule."""
        for field, label in _NAMES.items():
            saved, now = getattr(self, field), getattr(current, field)
            if saved != now:
                if field == "schedule":
                    saved, now = saved.to_dict(), now.to_dict()
                raise ValueError(f"this step state is for another {label}: the state has {saved!r}, this run {now!r}")


def find_step_state(node: Any) -> dict[str, Any] | None:
    """The first step state inside a nested state (e.g. a StatefulDataLoader's), or None."""
    return find_nested(node, lambda d: STEP_STATE_KEY in d)


def find_nested(node: Any, match: Callable[[Mapping[str, Any]], bool]) -> dict[str, Any] | None:
    """The first mapping inside ``node`` (itself, then its values depth first) that ``match`` accepts, or None."""
    if isinstance(node, Mapping):
        if match(node):
            return dict(node)
        for value in node.values():
            found = find_nested(value, match)
            if found is not None:
                return found
    return None
