"""The resume state: one frozen value, its format version, and every check of a loaded one.

A state names positions of the epoch order, not ranks, so it can be loaded on any world size. It is
a small JSON-serialisable dict on the wire (``to_dict`` / ``from_dict``). A state of a mix of sources
records the mix too (:class:`MixRecord`); a state of plain meta files has no ``mix`` key at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rank_dataset.core.checks import MAX_EXACT, check_at_most, check_int
from rank_dataset.plan.mix import MixPlan, Mixture, changes_from_list
from rank_dataset.plan.spec import MAX_WORLD_SIZE, ResumePoint, ShardSpec, mini_epoch_width
from rank_dataset.plan.step_state import find_nested

__all__ = ["STATE_VERSION", "MixRecord", "ResumeState", "SourceRecord", "find_state"]

#: The format version of resume states; a state of another version is refused.
STATE_VERSION = 1


@dataclass(frozen=True)
class SourceRecord:
    """One source of a mix as a resume state records it.

    Args:
        name: the source's name (for messages only: a renamed source with the same files matches).
        num_samples: ``N_s``, the samples of its files.
        fingerprint: the hash of its files (None: unknown).
        count: ``c_s``, the samples an epoch takes of it.
    """

    name: str
    num_samples: int
    fingerprint: str | None
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"mix source name must be a str, got {self.name!r}")
        check_int(f"mix source {self.name!r} num_samples", self.num_samples, low=1, high=MAX_EXACT)
        if self.fingerprint is not None and not isinstance(self.fingerprint, str):
            raise TypeError(f"mix source {self.name!r} fingerprint must be a str or None, got {self.fingerprint!r}")
        check_int(f"mix source {self.name!r} count", self.count, low=1, high=MAX_EXACT)


@dataclass(frozen=True)
class MixRecord:
    """The mix a resume state was taken on: its sources, in order, and the epoch size ``T0``.

    Args:
        epoch_size: ``T0 = sum(count)``.
        sources: one :class:`SourceRecord` per source (at least one); ``count`` is of epoch 0.
        changes: the counts that the sources' schedules set from later epochs on, as
            :attr:`~rank_dataset.plan.mix.MixPlan.changes` (empty: none; no ``changes`` key in the dict).
    """

    epoch_size: int
    sources: tuple[SourceRecord, ...]
    changes: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, mixture: Mixture) -> MixRecord:
        """The record of a dataset's mixture."""
        plan = mixture.plan
        records = zip(mixture.sources, plan.sizes, mixture.fingerprints, plan.counts)
        return cls(plan.epoch_size, tuple(SourceRecord(s.name, n, f, c) for s, n, f, c in records), plan.changes)

    def __post_init__(self) -> None:
        if not isinstance(self.sources, tuple) or not self.sources:
            raise ValueError(f"mix sources must be a non-empty tuple of SourceRecord, got {self.sources!r}")
        for source in self.sources:
            if not isinstance(source, SourceRecord):
                raise TypeError(f"mix sources must be SourceRecords, got {source!r}")
        total = check_int("mix epoch_size", self.epoch_size, low=1, high=MAX_EXACT)
        if total != sum(s.count for s in self.sources):
            counts = sum(s.count for s in self.sources)
            raise ValueError(f"mix epoch_size must be the sum of the counts, {counts}, got {total}")
        # The changes are checked (and normalised to tuples) as a plan's are.
        object.__setattr__(self, "changes", self.plan.changes)

    @property
    def plan(self) -> MixPlan:
        """The mix's plan: what fixes which samples each epoch takes."""
        sizes = tuple(s.num_samples for s in self.sources)
        return MixPlan(sizes, tuple(s.count for s in self.sources), self.epoch_size, self.changes)

    def to_dict(self) -> dict[str, Any]:
        data = {"epoch_size": self.epoch_size, "sources": [dataclasses.asdict(s) for s in self.sources]}
        if self.changes:
            data["changes"] = [[first, list(counts)] for first, counts in self.changes]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> MixRecord:
        if not isinstance(data, Mapping) or not {"epoch_size", "sources"} <= set(data) <= {
            "epoch_size",
            "sources",
            "changes",
        }:
            raise ValueError(f"mix must be a dict with the keys epoch_size and sources (and changes), got {data!r}")
        sources = data["sources"]
        if not isinstance(sources, Sequence) or isinstance(sources, (str, bytes)):
            raise TypeError(f"mix sources must be a list, got {sources!r}")
        keys = {f.name for f in dataclasses.fields(SourceRecord)}
        records = []
        for i, source in enumerate(sources):
            if not isinstance(source, Mapping) or set(source) != keys:
                raise ValueError(f"mix source {i} must be a dict with the keys {sorted(keys)}, got {source!r}")
            records.append(SourceRecord(**source))
        return cls(data["epoch_size"], tuple(records), changes_from_list(data.get("changes", ()), "mix changes"))

    def counts_up_to(self, epoch: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """The counts in force from epoch 0 up to ``epoch``: ``((first_epoch, counts), ...)``."""
        return ((0, self.plan.counts), *((e, c) for e, c in self.changes if e <= epoch))

    def check(self, other: MixRecord | None, epoch: int = 0) -> None:
        """Raise ValueError, naming the source that differs, unless ``other`` (a dataset's mix) is
        this mix up to ``epoch`` (the state's): the same files, and the same counts in every epoch up
        to it. Schedules may differ after it (the dataset's then takes over); source names may differ."""
        if other is None:
            names = ", ".join(repr(s.name) for s in self.sources)
            raise ValueError(
                f"the resume state is for a mix of {len(self.sources)} source(s) ({names}), "
                "but this dataset reads plain meta files"
            )
        if len(other.sources) != len(self.sources):
            raise ValueError(
                f"the resume state is for a mix of {len(self.sources)} sources, this dataset mixes {len(other.sources)}"
            )

        def named(i: int) -> str:
            mine, theirs = self.sources[i], other.sources[i]
            return f"source {i} {theirs.name!r}" + ("" if mine.name == theirs.name else f" (the state's {mine.name!r})")

        for i, (mine, theirs) in enumerate(zip(self.sources, other.sources)):
            for field, what in [("num_samples", "samples"), ("fingerprint", "fingerprint")]:
                a, b = getattr(mine, field), getattr(theirs, field)
                if a != b and not (field == "fingerprint" and (a is None or b is None)):
                    raise ValueError(
                        f"the resume state is for another mix: {named(i)} has {what} {b}, the state's has {a}"
                    )
        mine_plan, their_plan = self.plan, other.plan
        firsts = sorted({first for first, _ in (*self.counts_up_to(epoch), *other.counts_up_to(epoch))})
        for first in firsts:
            a, b = mine_plan.counts_at(first), their_plan.counts_at(first)
            differ = [f"{named(i)} has count {b[i]}, the state's has {a[i]}" for i in range(len(a)) if a[i] != b[i]]
            if differ:
                raise ValueError(
                    f"the resume state is for another mix: {'; '.join(differ)}, at epoch {first} (a schedule may "
                    f"change only after the state's epoch {epoch}, the one it resumes)"
                )
        if self.epoch_size != other.epoch_size:  # pragma: no cover - equal counts give equal sums
            raise ValueError(f"the resume state is for epoch_size {self.epoch_size}, this mix has {other.epoch_size}")


@dataclass(frozen=True)
class ResumeState:
    """Where a run stopped: the files, the plan, and the positions of the epoch order consumed.

    Args:
        num_samples: the number of samples of the meta files the state is for; for a mix, its epoch
            size ``T0`` (the positions of the epoch order).
        fingerprint: the meta files' fingerprint (None: unknown).
        seed: the plan's seed.
        epoch: the epoch that was interrupted.
        mini_epoch: the plan's number of mini-epochs.
        mini_epoch_idx: the mini-epoch that was interrupted.
        plan_world_size: the world size that mini-epoch was planned on.
        consumed_positions: positions of that mini-epoch consumed, summed over all ranks.
        world_size: the world size the state was taken on.
        consumed: samples consumed per rank (what a sampler on the same world size skips).
        mix: for a mix of sources, the mix (None: plain meta files, and no ``mix`` key in the dict).
        aug_repeats: the plan's repeated augmentation ``k`` (a state without it is for ``k = 1``): it
            fixes which sample each position holds, so a state loads only into a plan of the same ``k``.
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
    mix: MixRecord | None = None
    aug_repeats: int = 1

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, low=1, high=MAX_EXACT)
        if self.fingerprint is not None and not isinstance(self.fingerprint, str):
            raise TypeError(f"fingerprint must be a str or None, got {self.fingerprint!r}")
        check_int("seed", self.seed, low=-MAX_EXACT, high=MAX_EXACT)
        check_int("epoch", self.epoch, low=0, high=MAX_EXACT)
        check_int("mini_epoch", self.mini_epoch, low=1, high=MAX_EXACT)
        check_int("mini_epoch_idx", self.mini_epoch_idx, low=0, high=self.mini_epoch, high_name="mini_epoch")
        check_at_most("plan_world_size", check_int("plan_world_size", self.plan_world_size, low=1), MAX_WORLD_SIZE)
        width = mini_epoch_width(self.num_samples, self.plan_world_size, self.mini_epoch)
        positions = check_int("consumed_positions", self.consumed_positions, low=0)
        if positions > width:
            raise ValueError(
                f"consumed_positions must be in [0, {width}] (the positions of a mini-epoch of this plan), "
                f"got {positions}"
            )
        if self.world_size is not None:
            check_int("world_size", self.world_size, low=1)
        if self.consumed is not None:
            check_int("consumed", self.consumed, low=0, high=MAX_EXACT)
        check_int("aug_repeats", self.aug_repeats, low=1, high=MAX_EXACT)
        if self.mix is not None:
            if not isinstance(self.mix, MixRecord):
                raise TypeError(f"mix must be a MixRecord or None, got {self.mix!r}")
            if self.mix.epoch_size != self.num_samples:
                raise ValueError(
                    f"num_samples of a mix's state must be its epoch_size {self.mix.epoch_size}, got {self.num_samples}"
                )

    @property
    def point(self) -> ResumePoint:
        """The resume point of the interrupted epoch."""
        return ResumePoint(self.plan_world_size, self.mini_epoch_idx, self.consumed_positions)

    @classmethod
    def at(cls, spec: ShardSpec, consumed: int, fingerprint: str | None, mix: MixRecord | None) -> ResumeState:
        """The state of a (train) shard of ``spec`` after every rank consumed ``consumed`` of its samples,
        on files of ``fingerprint`` (and for a mix, ``mix``)."""
        return cls(
            num_samples=spec.num_samples,
            fingerprint=fingerprint,
            seed=spec.seed,
            epoch=spec.epoch,
            mini_epoch=spec.mini_epoch,
            mini_epoch_idx=spec.mini_epoch_idx,
            plan_world_size=spec.resume.plan_world_size if spec.resume else spec.world_size,
            consumed_positions=spec.consumed_positions(consumed),
            world_size=spec.world_size,
            consumed=consumed,
            mix=mix,
            aug_repeats=spec.aug_repeats,
        )

    def apply(self, spec: ShardSpec) -> ShardSpec:
        """``spec`` (a rank's, on any world size) moved to its share of what was left of the
        interrupted mini-epoch.

        Raises:
            ValueError: ``spec`` has another ``aug_repeats`` than the state (the positions would hold
                other samples).
        """
        if spec.aug_repeats != self.aug_repeats:
            raise ValueError(
                f"the resume state is for aug_repeats={self.aug_repeats}, this dataset has aug_repeats="
                f"{spec.aug_repeats}: its positions would hold other samples; resume with "
                f"reload_cfg['aug_repeats']={self.aug_repeats}"
            )
        return dataclasses.replace(
            spec,
            mini_epoch=self.mini_epoch,
            mini_epoch_idx=self.mini_epoch_idx,
            seed=self.seed,
            epoch=self.epoch,
            resume=self.point,
        )

    def check_files(
        self, num_samples: int, fingerprint: str | None, mix: MixRecord | None = None, held: int | None = None
    ) -> None:
        """Raise ValueError unless the state is for files with this count and fingerprint, and for
        this mix (None: plain files); a mix that differs is named by its first differing source.
        ``held``: the samples the files hold, where the plan's ``num_samples`` leaves some out (named
        in the message, so that an ``exclude=`` that differs is not read as other files)."""
        if self.mix is not None:
            self.mix.check(mix, self.epoch)
        elif mix is not None:
            raise ValueError(
                f"the resume state is for plain meta files, but this dataset mixes {len(mix.sources)} sources"
            )
        if self.num_samples != num_samples:
            if held is not None and held != num_samples:
                raise ValueError(
                    f"the resume state is for {self.num_samples} samples, but this dataset plans {num_samples}: "
                    f"its meta files hold {held}, of which it leaves {held - num_samples} out (exclude=, or "
                    "samples that failed); build it with the exclude= of the run that saved the state"
                )
            hint = ""
            if held is not None and self.num_samples < num_samples:
                hint = (
                    f" (if the run that saved it left {num_samples - self.num_samples} samples out with exclude=, "
                    "build this dataset with the same exclude=)"
                )
            raise ValueError(
                f"the resume state is for {self.num_samples} samples, but these meta files hold {num_samples}{hint}"
            )
        if self.fingerprint is not None and fingerprint is not None and self.fingerprint != fingerprint:
            raise ValueError(
                f"the resume state is for other meta files: fingerprint {self.fingerprint} != {fingerprint} "
                "(same number of samples, different contents or sizes)"
            )

    def same_shard(self, other: ResumeState) -> bool:
        """Whether both states are points within the same mini-epoch of the same plan and files."""
        keys = ("num_samples", "fingerprint", "seed", "epoch", "mini_epoch", "mini_epoch_idx", "aug_repeats")
        return all(getattr(self, k) == getattr(other, k) for k in keys) and _mix_key(self.mix, self.epoch) == _mix_key(
            other.mix, other.epoch
        )

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON-serialisable dict, with its format version (and ``mix`` only for a mix)."""
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "mix"}
        if self.mix is not None:
            state["mix"] = self.mix.to_dict()
        return {"version": STATE_VERSION, **state}

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
            values = {k: v for k, v in state.items() if k in fields}
            if values.get("mix") is not None:
                values["mix"] = MixRecord.from_dict(values["mix"])
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"invalid resume state: {exc}") from None


def _mix_key(mix: MixRecord | None, epoch: int) -> tuple[Any, ...] | None:
    """What identifies a mix up to ``epoch``: its sources' numbers (not their names) and its counts."""
    if mix is None:
        return None
    return (mix.epoch_size, *((s.num_samples, s.fingerprint) for s in mix.sources), mix.counts_up_to(epoch))


def find_state(node: Any) -> dict[str, Any] | None:
    """The first resume state dict inside a nested state (e.g. a StatefulDataLoader's), or None."""
    return find_nested(node, lambda d: d.get("version") == STATE_VERSION and "consumed_positions" in d)
