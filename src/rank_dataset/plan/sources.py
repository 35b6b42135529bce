"""Sources of a mix: :class:`Source` (files or listed samples, with a weight, a repeat or a choose, and
schedules of them) and :class:`SourceInfo`. The mixing model: :mod:`rank_dataset.plan.mix`."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from rank_dataset.core.checks import check_int, with_storage
from rank_dataset.core.parsers import Parser, resolve_parser
from rank_dataset.plan.exclude import Exclusion
from rank_dataset.plan.schedule import in_force_at
from rank_dataset.plan.subsets import SampleIds

__all__ = ["PathArg", "Rule", "Source", "SourceInfo", "as_sources", "column_names", "in_force"]

PathArg = str | os.PathLike[str]


def _positive_float(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _fspath(i: int, path: Any, storage_options: Mapping[str, Any] | None = None) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"paths[{i}] must be a str or os.PathLike, got {path!r} ({type(path).__name__})")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"paths[{i}] must be a str path, got bytes {text!r}")
    if not text:
        raise ValueError(f"paths[{i}] is an empty path")
    return cast(str, with_storage(text, storage_options))  # an object's URL carries its settings


def column_names(columns: Any, label: str = "columns") -> tuple[str, ...]:
    """``columns`` (of a Parquet meta file) as a non-empty tuple of distinct column names.

    Raises:
        TypeError: naming ``label``: not a sequence of str.
        ValueError: naming ``label``: empty, or a name given twice.
    """
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        raise TypeError(f"{label} must be a sequence of column names, e.g. ['path', 'label'], not {columns!r}")
    names = tuple(columns)
    bad = [c for c in names if not isinstance(c, str)]
    if bad:
        raise TypeError(f"{label} must be column names (str), got {bad[0]!r} ({type(bad[0]).__name__})")
    if not names:
        raise ValueError(f"{label} is empty: name at least one column (or None for all)")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise ValueError(f"{label} names {twice[0]!r} twice; name each column once")
    return names


Rule = float | Mapping[int, float]  # a value, or a schedule {first_epoch: value}


def _step_rule(weight: Any, repeat: Any, choose: Any, by: Any) -> dict[int, Any] | None:
    """For ``by="step"``, the schedule by step of the one rule given (``weight``, ``repeat`` or ``choose``),
    checked and sorted (a number: ``{0: number}``); None for ``by="epoch"``."""
    if by == "epoch":
        return None
    if by != "step":
        raise ValueError(f"by must be 'epoch' or 'step', got {by!r}")
    given = [(k, v) for k, v in (("weight", weight), ("repeat", repeat), ("choose", choose)) if v is not None]
    if len(given) != 1:
        what = "none" if not given else " and ".join(k for k, _ in given)
        raise ValueError(
            "by='step' schedules one rule: give one of weight=, repeat= or choose= (a value or {first_step: value}), "
            f"got {what}"
        )
    kind, value = given[0]
    rule = value if isinstance(value, Mapping) else {0: value}
    checked: dict[int, Any] = {}
    for step, v in rule.items():
        first = check_int(f"{kind} schedule step", step, low=0)
        label = f"{kind}[{first}]"
        checked[first] = check_int(label, v, low=1) if kind == "choose" else _positive_float(label, v)
    if 0 not in checked:
        raise ValueError(f"a {kind} schedule by step must hold step 0, got the steps {sorted(checked)}")
    return dict(sorted(checked.items()))


def _rule(name: str, value: Any, check: Callable[[str, Any], Any]) -> Any:
    """``value`` checked by ``check``; a schedule ``{first_epoch: value}`` checked entry by entry and
    sorted by epoch (a schedule of epoch 0 alone is its value)."""
    if not isinstance(value, Mapping):
        return check(name, value)
    rules = {}
    for epoch, v in value.items():
        first = check_int(f"{name} schedule epoch", epoch, low=0)
        rules[first] = check(f"{name}[{first}]", v)
    if 0 not in rules:
        raise ValueError(
            f"a {name} schedule must hold epoch 0 (the rule from the start), got the epochs {sorted(rules)}"
        )
    return rules[0] if len(rules) == 1 else dict(sorted(rules.items()))


def in_force(rule: Any, at: int) -> Any:
    """The value of ``rule`` (a value, or a sorted schedule ``{first_epoch: value}`` or by step) in force at ``at``."""
    return in_force_at(sorted(rule.items()), at) if isinstance(rule, Mapping) else rule


@dataclass(frozen=True, init=False)
class Source:
    """One source of a mix: one meta file, or a list of them taken as one source, or the listed samples
    of them, and how much of it an epoch takes. It does not open the meta files.

    Args:
        paths: a path, or a non-empty list of paths (taken as one source, in order). Stored as a
            tuple of str.
        ids: None (every sample of the files), or the samples of the source: 0-based sample numbers
            over its files taken as one, as a 1-D integer array or the path of a ``.npy`` file (which
            is memory-mapped, as is a view of a memory-mapped array such as a value of
            :func:`~rank_dataset.files.group.grouping.group_by`: ranks and workers then read only the ids at
            their positions). The listed order is the order in eval mode. Stored as a
            ``SampleIds``; checked (distinct, in range) when a dataset opens the files.
        exclude: None, or sample numbers (in the numbering of ``ids``: over its files taken as one) to
            leave out of the source, the complement of ``ids``: a 1-D integer array, a list, or the
            path of a ``.npy`` file. With ``ids``, the listed ids that it names are left out. Stored
            sorted as an :class:`~rank_dataset.plan.exclude.Exclusion` (8 bytes a number; what is
            kept is never materialised); checked (in range, something left) when a dataset opens the files.
        weight: share of what the fixed-count sources leave of the epoch, in proportion to the
            other weights; a finite float > 0.
        repeat: the epoch takes ``round(repeat * N)`` samples (``N``: the source's size); a finite
            float > 0, may be < 1.
        choose: the epoch takes exactly ``choose`` samples; an int >= 1 (may exceed ``N``).
        parser: None (the dataset's parser), ``"json"``, ``"label"`` or a callable, for this
            source's items.
        name: for messages; defaults to the first path's file name (the whole path if it has none).
        columns: for Parquet files, the columns whose values, joined by a tab, make a row's line, in
            that order; None for all. Stored as a tuple of str; checked against the files (and refused
            for a file that is not Parquet) when a dataset opens them.
        storage_options: for paths that are object URLs (``s3://``, ``gs://``, ``az://``,
            ``https://``): obstore's settings (e.g. ``endpoint``, ``access_key_id``, ``region``), over
            the environment's. Carried by the paths (a ``UrlPath`` each), never shown in a repr.
        by: ``"epoch"`` (a schedule's keys are epochs) or ``"step"``: the one rule given (``weight``,
            ``repeat`` or ``choose``) is a value or a schedule ``{first_step: value}`` holding step 0, of a run
            by steps (a :class:`~rank_dataset.training.steps.StepSampler`; see
            :mod:`rank_dataset.plan.step_mix`), stored in ``step_rule``; the rule's own field then holds its
            value at step 0, what an epoch-by-epoch reading of the mix (and its epoch size) uses.

    At most one of ``weight``, ``repeat`` and ``choose``; none means ``repeat=1.0``. Each may be a
    schedule, a dict ``{first_epoch: value}`` holding epoch 0: the value in force from that epoch on
    (stored sorted by epoch; ``{0: v}`` alone is ``v``). With ``by="step"`` the keys are steps.

    Examples:
        >>> Source("data/a.txt", weight=2)  # doctest: +ELLIPSIS
        Source(paths=('data/a.txt',), weight=2.0, repeat=None, choose=None, parser=None, name='a.txt', ids=None, ...)
        >>> Source(["x/b1.txt", "x/b2.txt"]).repeat
        1.0
        >>> late = Source("c.txt", weight={10: 3, 0: 1})
        >>> late.weight, late.changes, late.at(12).weight
        ({0: 1.0, 10: 3.0}, (10,), 3.0)
        >>> Source("data/a.txt", ids=[5, 2, 9], name="a few").ids
        SampleIds(n=3)
        >>> more = Source("d.txt", repeat={0: 1, 5000: 2}, by="step")
        >>> more.repeat, more.step_rule, more.value_at_step(6000)
        (1.0, {0: 1.0, 5000: 2.0}, 2.0)
    """

    paths: tuple[str, ...]
    weight: float | dict[int, float] | None
    repeat: float | dict[int, float] | None
    choose: int | dict[int, int] | None
    parser: str | Parser | None
    name: str
    ids: SampleIds | None
    exclude: Exclusion | None = None
    columns: tuple[str, ...] | None = None
    step_rule: dict[int, float] | dict[int, int] | None = None

    def __hash__(self) -> int:  # a schedule is a dict: hash its items
        def frozen(rule: Any) -> Any:
            return tuple(rule.items()) if isinstance(rule, Mapping) else rule

        return hash(
            (
                self.paths,
                *map(frozen, (self.weight, self.repeat, self.choose)),
                self.parser,
                self.name,
                self.ids,
                self.exclude,
                self.columns,
                None if self.step_rule is None else tuple(self.step_rule.items()),
            )
        )

    def __init__(
        self,
        paths: PathArg | Sequence[PathArg],
        *,
        ids: Any = None,
        exclude: Any = None,
        weight: Rule | None = None,
        repeat: Rule | None = None,
        choose: int | Mapping[int, int] | None = None,
        parser: str | Parser | None = None,
        name: str | None = None,
        columns: Sequence[str] | None = None,
        by: str = "epoch",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        step_rule = _step_rule(weight, repeat, choose, by)
        if step_rule is not None:  # the field of its kind holds the value at step 0
            if weight is not None:
                weight = step_rule[0]
            elif repeat is not None:
                repeat = step_rule[0]
            else:
                choose = step_rule[0]
        if isinstance(paths, (str, os.PathLike)):
            normal: tuple[str, ...] = (_fspath(0, paths, storage_options),)
        elif isinstance(paths, Sequence) and not isinstance(paths, (bytes, bytearray)):
            normal = tuple(_fspath(i, p, storage_options) for i, p in enumerate(paths))
            if not normal:
                raise ValueError("paths must be a path or a non-empty list of paths, got an empty list")
        else:
            raise TypeError(f"paths must be a path or a list of paths, got {paths!r} ({type(paths).__name__})")
        given = [k for k, v in (("weight", weight), ("repeat", repeat), ("choose", choose)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of weight, repeat and choose, got {' and '.join(given)}")
        if weight is not None:
            weight = _rule("weight", weight, _positive_float)
        elif choose is not None:
            choose = _rule("choose", choose, lambda label, v: check_int(label, v, low=1))
        else:
            repeat = 1.0 if repeat is None else _rule("repeat", repeat, _positive_float)
        resolve_parser(parser)  # raises on anything but None, "json", "label" or a callable
        if name is None:
            name = os.path.basename(normal[0]) or normal[0]
        elif not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r} ({type(name).__name__})")
        elif not name:
            raise ValueError("name must not be empty")
        for field, value in [("paths", normal), ("weight", weight), ("repeat", repeat), ("choose", choose)]:
            object.__setattr__(self, field, value)
        object.__setattr__(self, "parser", parser)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "ids", None if ids is None else SampleIds.of(ids, name))
        object.__setattr__(self, "exclude", None if exclude is None else Exclusion.of(exclude, f"source {name!r}"))
        object.__setattr__(
            self, "columns", None if columns is None else column_names(columns, f"source {name!r}: columns")
        )
        object.__setattr__(self, "step_rule", step_rule)

    @property
    def kind(self) -> str:
        """Which rule the source has: ``"weight"``, ``"repeat"`` or ``"choose"``."""
        return "weight" if self.weight is not None else "choose" if self.choose is not None else "repeat"

    @property
    def changes(self) -> tuple[int, ...]:
        """The epochs after 0 at which the source's rule changes (empty without a schedule)."""
        rule = getattr(self, self.kind)
        return tuple(e for e in rule if e) if isinstance(rule, Mapping) else ()

    def value_at(self, epoch: int) -> float:
        """The value of the source's rule in force at ``epoch`` (an int for ``choose``)."""
        value: float = in_force(getattr(self, self.kind), epoch)
        return value

    def value_at_step(self, step: int) -> float:
        """The value of the source's rule in force at ``step`` of a run by steps: its schedule by step's
        (``by="step"``), else its rule's (which must then have no schedule by epoch)."""
        value: float = in_force(getattr(self, self.kind) if self.step_rule is None else self.step_rule, step)
        return value

    def at(self, epoch: int) -> Source:
        """This source with the rule in force at ``epoch`` and no schedule (itself if it has none)."""
        if not self.changes:
            return self
        value = self.value_at(epoch)
        # The same source (its subset too, not checked again) with the value in force as its rule.
        source = copy.copy(self)
        object.__setattr__(source, self.kind, int(value) if self.kind == "choose" else value)
        return source

    def describe(self, epoch: int = 0) -> str:
        """The rule in force at ``epoch``, e.g. ``"weight=2"``, ``"choose=1,000"``."""
        value = self.value_at(epoch)
        return f"choose={int(value):,}" if self.kind == "choose" else f"{self.kind}={value:g}"


@dataclass(frozen=True)
class SourceInfo:
    """One source of a dataset's mix, with its numbers in the current epoch (what ``ds.sources`` lists).

    Args:
        source: the Source as given.
        num_samples: ``N_s``, the samples of its files.
        count: ``c_s``, the samples the current epoch takes of it (in eval mode: ``N_s``, every sample once).
        offset: the global number of its first sample (``sum(N_0..N_{s-1})``).
        target: what its rule in force asks an epoch to take before rounding (see
            :func:`~rank_dataset.plan.counts.mix_targets`).
        fingerprint: the hash of its files (see :func:`~rank_dataset.plan.mix.combine_fingerprints`).
        taken: the samples drawn from its stream from epoch 0 through the current epoch (with
            repeated augmentation, draws: each is read ``aug_repeats`` times); in eval mode ``N_s``.
    """

    source: Source
    num_samples: int
    count: int
    offset: int
    target: float
    fingerprint: str
    taken: int = 0

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    @property
    def passes(self) -> float:
        """``c_s / N_s``: how many times an epoch goes through the source (< 1: a part of it)."""
        return self.count / self.num_samples

    @property
    def passes_completed(self) -> int:
        """Whole passes through the source from epoch 0 through the current epoch: ``taken // N_s``."""
        return self.taken // self.num_samples

    @property
    def epochs_seen(self) -> float:
        """``taken / N_s``: how many times the source has been gone through, as a fraction."""
        return self.taken / self.num_samples


def as_sources(value: Any) -> tuple[Source, ...] | None:
    """``value`` as a tuple of Sources if it is a Source or a list of them; None if it holds none.

    Raises:
        TypeError: a list that holds Sources and other things.
    """
    if isinstance(value, Source):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        kinds = [isinstance(v, Source) for v in value]
        if all(kinds):
            return tuple(value)
        if any(kinds):
            bad = next(v for v, k in zip(value, kinds) if not k)
            raise TypeError(f"a list of sources must hold only Source objects, got {bad!r}: wrap each path in a Source")
    return None
