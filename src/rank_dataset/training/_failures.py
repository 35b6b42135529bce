"""Items that fail to load: the user's ``transform``, and the deterministic substitute of an item it raised on.

With ``on_error="replace"``, an item whose parse or ``transform`` raises is replaced by the item of a
substitute from this rank's current shard: shard index ``j`` of a keyed hash of ``(seed, epoch,
mini-epoch, position, attempt)``, ``position`` being the failing item's position in the epoch order.
``j`` is taken after the failing item (``i < j < n``) while there is one: on a resume on the same world
size the shard is a suffix of the one it resumes, so the same failure gets the same substitute. A
substitute that fails too is recorded and the next attempt tried. Every failure is recorded (see
:mod:`rank_dataset.shards.failures`) and counted against ``max_failures``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rank_dataset.errors import TooManyFailuresError
from rank_dataset.plan.permutation import hash_keys
from rank_dataset.plan.spec import ShardSpec, eval_range
from rank_dataset.shards.failures import Failure

__all__ = ["ON_ERROR", "FailurePolicy", "choose_substitute", "position_of", "too_many"]

OnError = Literal["raise", "replace"]
ON_ERROR: tuple[OnError, ...] = ("raise", "replace")
MAX_ATTEMPTS = 16  # substitutes tried for one item before giving up
_FORWARD_ATTEMPTS = 4  # attempts that look after the failing item only; later ones anywhere in the shard
_NAMED = 5  # failures an error message names


@dataclass(frozen=True)
class FailurePolicy:
    """What a dataset does with an item that fails: ``transform``, ``on_error``, ``max_failures``,
    ``exclude_failures`` (checked here, with messages naming the value)."""

    transform: Callable[[Any], Any] | None
    on_error: OnError
    max_failures: int | float | None
    exclude_failures: bool

    def __post_init__(self) -> None:
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform must be a function of the parsed sample or None, got {self.transform!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'replace', got {self.on_error!r}")
        limit = self.max_failures
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, float)):
                raise TypeError(f"max_failures must be an int, a float in [0, 1] or None, got {limit!r}")
            if isinstance(limit, int) and limit < 0:
                raise ValueError(f"max_failures must be >= 0 (a count of failures in a pass), got {limit}")
            if isinstance(limit, float) and not 0.0 <= limit <= 1.0:
                raise ValueError(f"max_failures as a float is a fraction of the pass, in [0, 1], got {limit}")
        if not isinstance(self.exclude_failures, bool):
            raise TypeError(f"exclude_failures must be a bool, got {self.exclude_failures!r}")
        if self.exclude_failures and self.on_error != "replace":
            raise ValueError(
                "exclude_failures=True needs on_error='replace' (with 'raise' the first failure ends the run)"
            )

    @property
    def active(self) -> bool:
        """Whether items go through this policy (a transform, or replaced failures)."""
        return self.transform is not None or self.on_error == "replace"

    def limit(self, pass_items: int) -> int | None:
        """The failures a pass of ``pass_items`` items may have (None: any number)."""
        limit = self.max_failures
        if limit is None:
            return None
        return limit if isinstance(limit, int) else math.floor(limit * pass_items)


def position_of(spec: ShardSpec, i: int) -> int:
    """The position in the epoch order of item ``i`` of the shard of ``spec`` (as ``spec.positions()[i]``)."""
    if spec.is_test:
        return eval_range(spec.num_samples, spec.world_size, spec.rank)[0] + i
    start, stop = spec.mini_epoch_span
    offset = spec.rank + i * spec.world_size
    if offset >= stop - start:
        offset %= stop - start
    return start + offset


def choose_substitute(spec: ShardSpec, position: int, i: int, n: int, attempt: int) -> int:
    """The shard index of the substitute for item ``i`` (at ``position``) of a shard of ``n``, on ``attempt``
    (1, 2, ...): keyed by the plan and the position, after ``i`` on the first attempts if it can be."""
    h = hash_keys(spec.seed, spec.epoch, spec.mini_epoch_idx, position, attempt)
    after = n - i - 1
    if after > 0 and attempt <= _FORWARD_ATTEMPTS:
        return i + 1 + h % after
    return int(h % n)


def too_many(
    failures: list[Failure], count: int, limit: float | None, n: int, rank: int, reason: str = ""
) -> Exception:
    """The TooManyFailuresError naming the first ``failures`` and how to leave them out."""
    named = "; ".join(str(f) for f in failures[:_NAMED])
    more = f" (and {len(failures) - _NAMED} more here)" if len(failures) > _NAMED else ""
    samples = sorted({f.sample for f in failures})[:_NAMED]
    head = (
        reason
        or f"{count} items failed to load in this pass over rank {rank}'s shard of {n}, past max_failures={limit}"
    )
    return TooManyFailuresError(
        f"{head}: {named}{more}. Leave them out with RankDataset(..., exclude={samples}) (or exclude=ids_of(meta, "
        f"paths) for a list of paths), or exclude_failures=True to leave out of later epochs every sample that "
        f"fails; or raise max_failures.",
        failures,
    )
