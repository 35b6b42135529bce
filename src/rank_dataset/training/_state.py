"""A dataset's resume state: building it (:meth:`ShardedDataset.state_dict`) and checking one to load
(:meth:`ShardedDataset.load_state_dict`), as functions of the plan and the inputs it is for.

The state is a :class:`~rank_dataset.plan.resume.ResumeState` as a dict, with the samples the plan left out for
having failed (``excluded_failures``) and the failure records (``failures``) when there are any; or, from
``state_dict()`` without ``consumed``, the failure records alone (no resume point).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rank_dataset.core.checks import check_int
from rank_dataset.shards.failures import Failure

if TYPE_CHECKING:  # the resume state's modules are imported by the rank that builds or loads one, on first use
    from rank_dataset.plan.mix import Mixture
    from rank_dataset.plan.resume import MixRecord, ResumeState
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.shards.reader import ShardReader
    from rank_dataset.training._failures import FailureBook

__all__ = ["Resumable", "read_state", "resumed", "state_at"]

FAILURES_ONLY = "failures"  # the one key of a state without a resume point


def state_at(
    spec: ShardSpec,
    consumed: int,
    n: int,
    reader: ShardReader,
    mixture: Mixture | None,
    excluded: str | None,
    failed: tuple[int, ...],
) -> dict[str, Any]:
    """The resume state of the shard of ``spec`` (of ``n`` items) after every rank consumed ``consumed``,
    on the files of ``reader`` (for a mix, ``mixture``) less what ``excluded`` fingerprints, the plan
    leaving out the failed samples ``failed``."""
    consumed = check_int("consumed", consumed, low=0)
    if consumed > n:
        raise ValueError(f"consumed must be in [0, {n}] (this rank's shard), got {consumed}")
    if spec.is_test:
        raise ValueError("an eval dataset (is_test=True) has no resume point: run eval from the start")
    from rank_dataset.plan.resume import ResumeState

    state = ResumeState.at(spec, consumed, fingerprint_of(reader, mixture, excluded), mix_record(mixture)).to_dict()
    if failed:  # the plan left these out: a resume must too
        state["excluded_failures"] = list(failed)
    return state


def read_state(state: Any, is_test: bool) -> tuple[ResumeState | None, tuple[int, ...], list[Failure]] | None:
    """The resume point (None in a state of failure records alone), the samples left out for having failed
    and the failure records of ``state`` (None for ``{}``), checked; ``is_test``: whether the dataset is an
    eval one (which cannot be resumed)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    if not state:
        return None
    if set(state) == {FAILURES_ONLY}:  # state_dict() without consumed: the records, no resume point
        return None, (), [Failure.from_dict(f) for f in _records(state[FAILURES_ONLY])]
    from rank_dataset.plan.resume import ResumeState

    resume = ResumeState.from_dict(state)
    if is_test:
        raise ValueError("an eval dataset (is_test=True) cannot be resumed: run eval from the start")
    failed = _sample_list(state.get("excluded_failures", []), "excluded_failures")
    failures = [Failure.from_dict(f) for f in _records(state.get("failures", []))]
    return resume, failed, failures


def resumed(
    resume: ResumeState, planned: ShardSpec, reader: ShardReader, mixture: Mixture | None, excluded: str | None
) -> ShardSpec:
    """``planned`` moved to the resume point ``resume``, once checked to be for the same inputs (as
    :func:`state_at` names them)."""
    held = None if mixture is not None else reader.num_samples  # a mix's sources are checked one by one
    resume.check_files(planned.num_samples, fingerprint_of(reader, mixture, excluded), mix_record(mixture), held)
    return resume.apply(planned)


def fingerprint_of(reader: ShardReader, mixture: Mixture | None, excluded: str | None) -> str | None:
    """The fingerprint a resume state records: the files' (and what is left out of them), or for a mix
    one of its sources' (each with what is left out of it)."""
    if mixture is not None:
        return mixture.fingerprint
    files = reader.fingerprint
    if files is None or excluded is None:
        return files
    from rank_dataset.plan.mix import combine_fingerprints

    return combine_fingerprints([files, excluded])


def mix_record(mixture: Mixture | None) -> MixRecord | None:
    if mixture is None:
        return None
    from rank_dataset.plan.resume import MixRecord

    return MixRecord.of(mixture)


def _sample_list(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(type(v) is int and v >= 0 for v in value):
        raise TypeError(f"invalid resume state: {key} must be a list of sample numbers, got {value!r}")
    return tuple(sorted(set(value)))


def _records(value: Any) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"invalid resume state: failures must be a list of failure records, got {value!r}")
    return list(value)


class Resumable:
    """``state_dict`` and ``load_state_dict`` of a dataset (a mixin of ShardedDataset, which sets these
    attributes and loads a shard with ``_load``)."""

    reader: ShardReader
    _book: FailureBook
    _spec: ShardSpec

    if TYPE_CHECKING:

        def __len__(self) -> int: ...

        def _load(self, spec: ShardSpec) -> None: ...

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The resume point after every rank consumed ``consumed`` samples of its current shard.

        A small JSON-serialisable dict (:class:`~rank_dataset.plan.resume.ResumeState`), the same on
        every rank (so rank 0 alone can save it). It names positions of the epoch order, not ranks,
        so it can be loaded on any world size.

        Called with no argument (as torchdata's StatefulDataLoader calls every dataset that has a
        ``state_dict``) it holds no resume point, which then lives in ResumableSampler's state: it is
        ``{}``, or with ``on_error="replace"`` the failure records seen so far on this rank (``{"failures":
        [...]}``, no collective), which ``load_state_dict`` adds to :attr:`failures` (and, with
        ``exclude_failures=True``, to what later epochs leave out). Pass ``consumed`` (or save
        ``ResumableSampler.state_dict()``) to resume mid-epoch.

        With ``on_error="replace"`` it holds the failure records (``failures``) and the samples the plan
        left out for having failed (``excluded_failures``). With ``exclude_failures=True`` under a process
        group it all-gathers every rank's failures, so that a resume leaves out of the next epoch what
        every rank saw fail: it is then a collective, to be called on every rank (and still the same on each).

        Raises:
            ValueError: ``consumed`` outside ``[0, len(self)]``, or an eval shard.

        Examples:
            >>> import tempfile, os
            >>> from rank_dataset import RankDataset
            >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
            >>> _ = open(p, "w").write("".join(f"{i}.jpg {i}\\n" for i in range(10)))
            >>> old = RankDataset(p, rank=0, world_size=2)
            >>> state = old.state_dict(consumed=2)
            >>> new = RankDataset(p, rank=0, world_size=2)
            >>> new.load_state_dict(state)
            >>> new.indices.tolist() == old.indices[2:].tolist()
            True
        """
        book = self._book
        if consumed is None:  # no resume point: the failure records alone (what a user saving it expects kept)
            if book.policy.on_error != "replace":
                return {}
            book.collect()
            return {FAILURES_ONLY: [f.to_dict() for f in book.records]} if book.records else {}
        n = len(self)
        state = state_at(self._spec, consumed, n, self.reader, book.mixture, book.exclusion_fingerprint, book.failed)
        failures = book.to_save()
        if failures:
            state["failures"] = [f.to_dict() for f in failures]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a resume point saved by :meth:`state_dict`, on this world size.

        This rank gets its share of what was left of the interrupted mini-epoch (all ranks equally
        long, padded by wrapping within it). Afterwards ``set_epoch(same_epoch, later_idx)`` keeps
        the boundaries that epoch started with, and ``set_epoch(next_epoch)`` plans afresh. The
        state's seed and mini-epoch count replace this dataset's. ``{}`` is ignored; a state of failure
        records alone (``state_dict()`` without ``consumed``) adds them to :attr:`failures` and changes
        no shard. A state that fails a check leaves the dataset exactly as it was.

        Raises:
            ValueError: a state for other files (number of samples or fingerprint) or another mix (the
                message names the first source that differs), of another format version, with
                missing keys or a value out of range (the message names it), or an eval dataset.
        """
        read = read_state(state, self._spec.is_test)
        if read is None:
            return
        resume, failed, failures = read
        book = self._book
        if resume is None:
            book.collect()
            book.merge(failures)
            return
        with book.replanned(self._spec, failed) as planned:
            self._load(resumed(resume, planned, self.reader, book.mixture, book.exclusion_fingerprint))
        if failures:
            book.collect()
            book.merge(failures)
