"""Items that fail to load: the failure policy, the deterministic substitute of an item that raised (in the
process that makes items), and the rank's book of failed samples and what its plan leaves out.

With ``on_error="replace"``, an item whose parse or ``transform`` raises is replaced by the item of a
substitute from this rank's current shard: shard index ``j`` of a keyed hash of ``(seed, epoch,
mini-epoch, position, attempt)``, ``position`` being the failing item's position in the epoch order.
``j`` is taken after the failing item (``i < j < n``) while there is one: on a resume on the same world
size the shard is a suffix of the one it resumes, so the same failure gets the same substitute. A
substitute that fails too is recorded and the next attempt tried. Every failure is recorded (see
:mod:`rank_dataset.shards.failures`) and counted against ``max_failures``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from rank_dataset.core.parsers import Parser
from rank_dataset.errors import TooManyFailuresError
from rank_dataset.plan.permutation import hash_keys
from rank_dataset.plan.spec import ShardSpec, eval_range
from rank_dataset.shards.failures import CAPACITY, Failure
from rank_dataset.training._agree import agreement_needed

if TYPE_CHECKING:  # a DataLoader worker unpickles the policy and the substitutes, not what the rank plans with
    from rank_dataset.plan.exclude import Exclusion
    from rank_dataset.plan.mix import MixPlan, Mixture
    from rank_dataset.plan.sources import Source
    from rank_dataset.shards.channel import ShardChannel
    from rank_dataset.shards.reader import ShardReader

__all__ = ["ON_ERROR", "FailureBook", "FailurePolicy", "Substitutes", "choose_substitute", "position_of", "too_many"]

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
    if spec.steps is not None:  # the step layout (a failure is rare: its positions are computed again)
        return int(spec.positions()[i])
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
    failures: list[Failure], count: int, limit: float | None, n: int, rank: int, reason: str = "", tried: int = 0
) -> Exception:
    """The TooManyFailuresError naming the first ``failures`` and how to leave them out; or, when ``tried``
    substitutes were tried in the pass and every one failed too, saying the data may be unreachable (leaving
    samples out or raising the limit would not help)."""
    named = "; ".join(str(f) for f in failures[:_NAMED])
    more = f" (and {len(failures) - _NAMED} more here)" if len(failures) > _NAMED else ""
    samples = sorted({f.sample for f in failures})[:_NAMED]
    head = (
        reason
        or f"{count} items failed to load in this pass over rank {rank}'s shard of {n}, past max_failures={limit}"
    )
    if tried:
        return TooManyFailuresError(
            f"{head}: {named}{more}. Every substitute tried failed too ({tried} of {tried} in this pass), so the "
            "data itself may be unreachable (a root not mounted, a wrong path prefix, a "
            "missing credential). Leaving samples out (exclude=) or raising max_failures would not help: check "
            "that one sample loads, e.g. transform(parser(line)) for the first failure above.",
            failures,
        )
    return TooManyFailuresError(
        f"{head}: {named}{more}. Leave them out with RankDataset(..., exclude={samples}) (or exclude=ids_of(meta, "
        f"paths) for a list of paths), or exclude_failures=True to leave out of later epochs every sample that "
        f"fails; or raise max_failures.",
        failures,
    )


class FailureBook:
    """A dataset's failed samples and what its plan leaves out: the failure records (one per sample, the
    first failure first, gathered from the readers through the channel), the samples ``exclude=`` and
    ``exclude_failures`` leave out, and the plan that leaves them out (the reader's and, for a mix, its
    Mixture). The rank holds one; a worker unpickles a copy without the records, what is left out or the channel
    (the dataset gives it its own), on first use."""

    def __init__(
        self,
        policy: FailurePolicy,
        exclude: Exclusion | None,
        reader: ShardReader,
        sources: tuple[Source, ...] | None,
        parser: Parser | None,
        epoch_size: int | None,
        aug_repeats: int,
    ) -> None:
        self.policy, self.reader, self._exclude = policy, reader, exclude
        self._mix_args = sources, parser, epoch_size, aug_repeats
        self.failed: tuple[int, ...] = ()  # samples left out of this epoch's plan for having failed before
        self.records: list[Failure] = []  # (rank) one record per failed sample, first failure first
        self.lost = 0
        self.mixture: Mixture | None = None
        self.exclusion_fingerprint: str | None = None
        self.channel: ShardChannel  # the dataset's, set once it exists (after the first plan)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_exclude"] = None  # workers never plan: the rank builds every shard
        state["records"], state["failed"] = [], ()
        state.pop("channel", None)
        return state

    # -- what is left out -------------------------------------------------------------------------

    def _exclusion(self, failed: Sequence[int] | None = None) -> Exclusion | None:
        """The samples left out of the plan: ``exclude=``, and the failed samples ``failed`` (default:
        those of the current plan)."""
        failed = self.failed if failed is None else failed
        if not failed:
            return self._exclude
        from rank_dataset.plan.exclude import Exclusion

        extra = Exclusion.of(list(failed), "failed samples")
        return extra if self._exclude is None else self._exclude.union(extra)

    @property
    def exclusion(self) -> Exclusion | None:
        """The samples the current plan leaves out: ``exclude=`` and those left out for having failed."""
        return self._exclusion()

    def plan(self, is_test: bool) -> tuple[int, MixPlan | None]:
        """Leave what is left out now out of the reader's plans; the plan's size and, for a mix, its MixPlan."""
        return self._plan(self._exclusion(), is_test)

    def _plan(self, exclusion: Exclusion | None, is_test: bool) -> tuple[int, MixPlan | None]:
        self.reader.set_exclusion(exclusion)
        self.exclusion_fingerprint = None if exclusion is None or not len(exclusion) else exclusion.fingerprint
        sources, parser, epoch_size, aug_repeats = self._mix_args
        if sources is None:
            return self.reader.plan_size, None
        sizes = self.reader.source_sizes
        assert sizes is not None
        from rank_dataset.plan.mix import Mixture

        self.mixture = Mixture(
            sources, sizes, self.reader.source_fingerprints, parser, is_test, epoch_size, aug_repeats
        )
        return self.mixture.plan.epoch_size, self.mixture.plan

    def _replan(self, spec: ShardSpec, failed: tuple[int, ...]) -> ShardSpec:
        """``spec`` with the failed samples ``failed`` left out (the reader, mix and ``failed`` follow)."""
        if failed == self.failed:
            return spec
        try:
            num_samples, mix = self._plan(self._exclusion(failed), spec.is_test)
        except BaseException:  # the mix refused it, after the reader took it: give the reader the old one
            self._plan(self._exclusion(), spec.is_test)
            raise
        self.failed = failed
        return dataclasses.replace(spec, num_samples=num_samples, mix=mix)

    @contextlib.contextmanager
    def replanned(self, spec: ShardSpec, failed: tuple[int, ...]) -> Iterator[ShardSpec]:
        """``spec`` with the failed samples ``failed`` left out; on an error in the block, the plan leaves
        out what it did before."""
        before = self.failed
        try:
            yield self._replan(spec, failed)
        except BaseException:
            self._replan(spec, before)
            raise

    # -- the records ------------------------------------------------------------------------------

    def collect(self) -> None:
        """Add the records the readers sent through the channel since the last call."""
        found, lost = self.channel.collect_failures()
        self.lost += lost
        if lost:  # a reader's ring overran: say so, rather than list fewer failures than there were
            what = "leaves out of later epochs only" if self.policy.exclude_failures else "lists only"
            warnings.warn(
                f"{lost} failure records were lost ({self.lost} in all): a reader recorded more than {CAPACITY} "
                f"failures between two collections (ds.failures, set_epoch, state_dict); the dataset {what} "
                "those recorded. Exclude the failing samples (exclude=) or lower max_failures",
                RuntimeWarning,
                stacklevel=3,
            )
        if found:  # file:line is found here, not in the worker, where it would cost each failure a read
            self.merge([located(f, self.reader.where) for f in found])

    def merge(self, records: Sequence[Failure]) -> None:
        """Add ``records`` to :attr:`records` (one per sample), all in plan order (epoch, mini-epoch,
        position): the same list on every rank that holds the same records."""
        merged: dict[int, Failure] = {}
        for failure in sorted([*self.records, *records], key=lambda f: (f.epoch, f.mini_epoch, f.position)):
            merged.setdefault(failure.sample, failure)
        self.records = list(merged.values())

    def agreed(self) -> tuple[int, ...]:
        """The samples that failed on any rank so far, with those left out already. Under a process group
        the ranks all-gather their records (a collective), so every rank plans from the same set."""
        self.collect()
        if agreement_needed():
            import torch.distributed as dist

            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.records)
            self.merge([f for part in gathered for f in part])
        return tuple(sorted({f.sample for f in self.records} | set(self.failed)))

    def to_save(self) -> list[Failure]:
        """The records a resume state keeps: with ``"replace"`` every rank's (a collective, with
        ``exclude_failures``) or this rank's, else none."""
        if self.policy.on_error != "replace":
            return []
        if self.policy.exclude_failures:  # every rank's failures: the next epoch's plan leaves them out
            self.agreed()
        else:
            self.collect()
        return self.records


def located(failure: Failure, where: Callable[[int], str]) -> Failure:
    """``failure`` with its sample's ``file:line`` (``where(sample)``), if it has none."""
    return failure if failure.where else dataclasses.replace(failure, where=where(failure.sample))


class Substitutes:
    """The substitutes of the items that fail where items are made (the rank, or a DataLoader worker): each
    failure recorded through the dataset's channel and counted against ``max_failures``."""

    def __init__(self, policy: FailurePolicy, channel: ShardChannel) -> None:
        self.policy, self.channel = policy, channel
        self._recent: list[Failure] = []  # this pass's failures seen here, for messages
        self._recent_pass = -1
        self._tried = self._replaced = 0  # this pass's substitutes tried here, and those that loaded

    def substitute(
        self,
        spec: ShardSpec,
        n: int,
        i: int,
        exc: Exception,
        made: Callable[[int], Any],
        indices: npt.NDArray[np.int64],
        where: Callable[[int], str],
    ) -> Any:
        """The item of item ``i``'s substitute in the shard of ``spec`` (of ``n`` items; ``made(j)`` makes
        item ``j``, sample ``indices[j]``, found at ``where(sample)``); each failure recorded and counted
        against ``max_failures``."""
        position = position_of(spec, i)
        self._failed_item(spec, n, int(indices[i]), position, exc, where)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            j = choose_substitute(spec, position, i, n, attempt)
            self._tried += 1
            try:
                item = made(j)
            except Exception as again:
                self._failed_item(spec, n, int(indices[j]), position_of(spec, j), again, where)
                continue
            self._replaced += 1
            return item
        raise too_many(
            [located(f, where) for f in self._recent[:5]], len(self._recent), None, n, spec.rank,
            f"no substitute could be made for item {i} of rank {spec.rank}'s shard: {MAX_ATTEMPTS} tried, all failed",
            self._unreachable(),
        )  # fmt: skip

    def _unreachable(self) -> int:
        """The substitutes tried in this pass if every one failed (none loaded), else 0."""
        return self._tried if self._replaced == 0 else 0

    def _failed_item(
        self, spec: ShardSpec, n: int, sample: int, position: int, exc: Exception, where: Callable[[int], str]
    ) -> None:
        failure = Failure.of(sample, "", exc, spec.epoch, spec.mini_epoch_idx, position)  # where: by the rank
        passes = self.channel.passes
        if passes != self._recent_pass:
            self._recent, self._recent_pass = [], passes
            self._tried = self._replaced = 0
        self._recent.append(failure)
        count = self.channel.record_failure(failure)
        limit = self.policy.limit(n)
        if limit is not None and count > limit:
            named = [located(f, where) for f in self._recent[:5]]
            raise too_many(named, count, self.policy.max_failures, n, spec.rank, tried=self._unreachable()) from exc
