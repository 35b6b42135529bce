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

__all__ = ["FAILURES_ONLY", "read_state", "resumed", "state_at"]

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
