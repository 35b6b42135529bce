"""Mixture edits at a resume: a run by steps whose mix changes at given steps, without repeating or skipping.

A run by steps (:mod:`rank_dataset.plan.steps`) is a stream of draws. Its mix (the *segment* in force) is one of:
plain files (``"plain"``: one source, the epochs' orders), a mix by epochs (``"epochs"``,
:class:`~rank_dataset.plan.mix.MixPlan`) or a mix by steps (``"steps"``, :class:`~rank_dataset.plan.step_mix.StepMix`).
Every segment says, for each of its draws, which source it reads and at which position of that source's *queue*:
the draw's sample is the queue's item there. A source's queue in the run's first segment is its own stream (its
stream of passes in a mix, the epochs' orders of plain files).

An edit at step ``t`` (draw ``Q = S(t) / k``) starts a new segment. Sources are matched across it by their
identity: the Source's name (which defaults to its first file's base name; a plain dataset's single source is
named so from its first file). For each source of the segment in force at ``Q``, its *epoch in progress* is the
segment's epoch holding draw ``Q`` (its current pass for a mix by steps); its items of that epoch not yet drawn
are its *pending* items, in the order the old segment would have drawn them. Then:

- a kept source's first draws in the new segment (in draw order) read its pending items, in their order; its other
  draws read its old queue from the end of that epoch on, at their queue positions in the new mix (less the
  pending ones before them): it reads what its epoch in progress still owed before anything else, and skips and
  repeats nothing;
- a new source's queue is its own stream from position 0 (its epoch 0);
- a removed source's pending items are dropped and counted (:attr:`Edit.dropped`).

The new segment's own epochs count from the edit; a mix by steps reads its rules at the run's steps. A chain's
state is its mixes and the edits' steps, never the samples.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_int
from rank_dataset.plan.counts import batch_counts
from rank_dataset.plan.mix import MixPlan, source_seed
from rank_dataset.plan.permutation import permute_stream
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.step_state import json_digest

__all__ = ["Edit", "MixSegment", "RemixChain", "SourceEntry"]

_KINDS = ("plain", "epochs", "steps")
_BLOCK = 1 << 20  # draws located at a time when the pending items are collected


@dataclass(frozen=True)
class SourceEntry:
    """One source of a segment: its identity, its samples ``N_s`` and its files' fingerprint (None: unknown).

    What a manifest needs to read a removed source's lines, which an edit does not compare: ``paths``, its meta
    files (None: not recorded), ``columns``, a Parquet source's columns, and ``listed``, whether its samples are a
    listing of its files' (``ids=``, a source's or the dataset's ``exclude=``), which a manifest can only take
    from a dataset that still holds the source.
    """

    name: str
    size: int
    fingerprint: str | None
    paths: tuple[str, ...] | None = field(default=None, compare=False)
    columns: tuple[str, ...] | None = field(default=None, compare=False)
    listed: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "size": self.size, "fingerprint": self.fingerprint}
        if self.paths is not None:
            d.update(paths=list(self.paths), columns=None if self.columns is None else list(self.columns))
            d["listed"] = self.listed
        return d

    @classmethod
    def from_dict(cls, data: Any) -> SourceEntry:
        """The entry of :meth:`to_dict`; ValueError naming what is invalid."""
        try:
            paths, columns = data.get("paths"), data.get("columns")
            return cls(
                str(data["name"]),
                int(data["size"]),
                data.get("fingerprint"),
                None if paths is None else tuple(str(p) for p in paths),
                None if columns is None else tuple(str(c) for c in columns),
                bool(data.get("listed", False)),
            )
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"invalid step state: a segment's sources are dicts of name, size, fingerprint: {exc}"
            ) from exc


@dataclass(frozen=True)
class MixSegment:
    """The mix in force from step ``step`` on: its kind, its sources and its plan.

    Args:
        step: the first global batch it makes (0 for the run's first segment).
        kind: ``"plain"``, ``"epochs"`` or ``"steps"``.
        sources: its sources, in the dataset's order (a plain segment: one).
        num_samples: ``T0``, the samples of its epoch (plain files: ``N``).
        mix: a ``"epochs"`` segment's MixPlan, a ``"steps"`` segment's StepMix (None for plain files).
    """

    step: int
    kind: str
    sources: tuple[SourceEntry, ...]
    num_samples: int
    mix: MixPlan | StepMix | None = None

    def __post_init__(self) -> None:
        check_int("segment step", self.step, low=0)
        if self.kind not in _KINDS:
            raise ValueError(f"a mix segment's kind is one of {_KINDS}, got {self.kind!r}")
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"two sources are named {twice[0]!r}: a mixture edit matches sources by name, give each a name "
                "of its own (Source(..., name=...))"
            )
        want = {"plain": type(None), "epochs": MixPlan, "steps": StepMix}[self.kind]
        if not isinstance(self.mix, want) or (self.kind == "plain" and len(self.sources) != 1):
            raise ValueError(f"a {self.kind!r} segment needs {want.__name__} and its sources, got {self.mix!r}")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "step": self.step,
            "kind": self.kind,
            "num_samples": self.num_samples,
            "sources": [s.to_dict() for s in self.sources],
        }
        if self.mix is not None:
            d["mix"] = self.mix.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Any) -> MixSegment:
        """The segment of :meth:`to_dict`; ValueError naming what is missing or invalid."""
        if not isinstance(data, Mapping) or not {"step", "kind", "num_samples", "sources"} <= set(data):
            raise ValueError(
                f"invalid step state: a mix segment is a dict of step, kind, num_samples, sources; got {data!r}"
            )
        kind, mix = data["kind"], data.get("mix")
        plan: MixPlan | StepMix | None = None
        if kind in ("epochs", "steps"):
            if not isinstance(mix, Mapping):
                raise ValueError(f"invalid step state: a {kind!r} segment holds its mix, got {mix!r}")
            plan = MixPlan.from_dict(mix) if kind == "epochs" else StepMix.from_dict(mix)
        if not isinstance(data["sources"], Sequence):
            raise ValueError(f"invalid step state: a segment's sources are a list, got {data['sources']!r}")
        sources = tuple(SourceEntry.from_dict(s) for s in data["sources"])
        return cls(int(data["step"]), kind, sources, int(data["num_samples"]), plan)

    def same_mix(self, other: MixSegment) -> bool:
        """The same sources and plan (whatever the first step)."""
        return dataclasses.replace(self, step=other.step) == other


@dataclass(frozen=True)
class Edit:
    """What an edit did to each source of the segment it ended.

    Args:
        step: the edit's step.
        epoch: each old source's epoch in progress (of the old segment, counted from its start; a mix by steps:
            the source's pass).
        consumed: each old source's items of that epoch drawn before the edit.
        pending: each old source's items of that epoch not drawn: a kept source reads them first, a removed
            source's are dropped.
        kept: each old source: whether the new segment has it.
    """

    step: int
    names: tuple[str, ...]
    epoch: tuple[int, ...]
    consumed: tuple[int, ...]
    pending: tuple[int, ...]
    kept: tuple[bool, ...]

    @property
    def dropped(self) -> dict[str, int]:
        """Each removed source's pending items, dropped by the edit."""
        return {n: p for n, p, k in zip(self.names, self.pending, self.kept) if not k}

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "sources": {
                n: {"epoch": e, "consumed": c, "pending": p, "kept": k}
                for n, e, c, p, k in zip(self.names, self.epoch, self.consumed, self.pending, self.kept)
            },
            "dropped": sum(self.dropped.values()),
        }


class _Queue:
    """A source's items in the order a segment reads them: ``at(j)`` the local sample numbers at positions ``j``."""

    def at(self, j: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        raise NotImplementedError


class _Stream(_Queue):
    """A source's own stream of passes (key ``source_seed(seed, index)``)."""

    def __init__(self, size: int, key: int) -> None:
        self.size, self.key = size, key

    def at(self, j: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return permute_stream(self.size, self.key, 0, j)


class _Continued(_Queue):
    """A kept source after an edit: its pending items, read by its first draws after the edit (draw order), then
    its old queue from ``resume`` on, read at the positions of the new mix left (in their order)."""

    def __init__(self, pending: npt.NDArray[np.int64], old: _Queue, resume: int) -> None:
        self.pending, self.old, self.resume = pending, old, resume
        self._first = np.empty(0, np.int64)  # the queue positions of the first draws, sorted
        self._items = np.empty(0, np.int64)  # the pending item each of them reads

    def settle(self, first: npt.NDArray[np.int64]) -> None:
        """Give pending item ``i`` to queue position ``first[i]`` (the new mix's ``i``-th draw of the source)."""
        order = np.argsort(first, kind="stable")  # (fewer than the pending items: the rest are never read)
        self._first, self._items = first[order], self.pending[: first.size][order]

    def at(self, j: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        j = np.asarray(j, np.int64)
        out = np.empty(j.shape, np.int64)
        if not self._first.size:
            return self.old.at(j + self.resume)
        below = np.searchsorted(self._first, j)  # pending positions before j: the rest skip them
        hit = self._first[np.minimum(below, self._first.size - 1)] == j
        out[hit] = self._items[below[hit]]
        rest = ~hit
        if rest.any():
            out[rest] = self.old.at(j[rest] - below[rest] + self.resume)
        return out


class _Live:
    """A segment with its draws and queues, ready to answer."""

    def __init__(self, segment: MixSegment, start: int, queues: list[_Queue], seed: int, k: int, sched: BatchSchedule):
        self.segment, self.start, self.queues = segment, start, queues
        self.seed, self.k, self.draws_schedule = seed, k, sched
        self.draws = -(-segment.num_samples // k)  # D, as rank_dataset.plan.steps.draws_per_epoch
        if isinstance(segment.mix, StepMix):
            self.base = np.array(segment.mix.taken(sched, segment.step), np.int64)

    def locate(self, q: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The source of each run draw ``q`` (all in this segment) and its position in that source's queue."""
        mix = self.segment.mix
        if isinstance(mix, StepMix):
            src, pos = mix.locate(q, self.draws_schedule, self.seed)
            return src, pos - self.base[src]
        r = q - self.start
        if mix is None:
            return np.zeros(r.shape, np.int64), r
        src = np.empty(r.shape, np.int64)
        pos = np.empty(r.shape, np.int64)
        lo, hi = (int(r.min()) // self.draws, int(r.max()) // self.draws) if r.size else (0, -1)
        epochs, d = np.divmod(r, self.draws) if lo != hi else (None, r - lo * self.draws)
        for e in range(lo, hi + 1):  # a window holds one epoch, or two (no sort: a range)
            where = epochs == e if epochs is not None else slice(None)
            src[where], pos[where] = mix.stream_positions(self.seed, e, d[where], self.k)
        return src, pos

    def local(self, q: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The source of each draw ``q`` and its local sample number."""
        src, pos = self.locate(q)
        out = np.empty(q.shape, np.int64)
        for s, queue in enumerate(self.queues):
            where = src == s if len(self.queues) > 1 else slice(None)
            out[where] = queue.at(pos[where])
        return src, out

    def epoch_of(self, q: int) -> tuple[list[int], list[int], int, list[int]]:
        """At draw ``q``: each source's epoch in progress, its items in it, the draw that ends it and each source's
        queue position after it. A mix by steps reads each queue in order: the epoch is the queue's pass, the
        draw ``q`` itself, the position where the queue is at ``q`` (what is left of the pass follows at once)."""
        mix, segment = self.segment.mix, self.segment
        n = len(segment.sources)
        if isinstance(mix, StepMix):
            now = mix.taken(self.draws_schedule, self.draws_schedule.step_at(q))
            at = [b - int(a) for a, b in zip(self.base, now)]
            sizes = [s.size for s in segment.sources]
            return [a // m for a, m in zip(at, sizes)], [a % m + (-a) % m for a, m in zip(at, sizes)], q, at
        e = (q - self.start) // self.draws
        end = self.start + (e + 1) * self.draws
        if mix is None:
            return [e], [self.draws], end, [(e + 1) * self.draws]
        return [e] * n, list(mix.draws(self.k, e)), end, list(mix.stream_starts(e + 1, self.k))


class RemixChain:
    """A run's mixes by steps, and the edits between them; what a state records of them.

    Args:
        segments: the mixes in force, the first at step 0, each later one from its edit's step (ascending).
        seed: the run's seed.
        aug_repeats: the run's ``k`` (an edit keeps it).
        schedule: the global batch size by step (an edit keeps it).

    Example:
        >>> a, b = SourceEntry("a", 10, None), SourceEntry("b", 6, None)
        >>> old = MixSegment(0, "epochs", (a,), 10, MixPlan((10,), (10,), 10))
        >>> new = MixSegment(3, "epochs", (a, b), 16, MixPlan((10, 6), (10, 6), 16))
        >>> chain = RemixChain((old, new), seed=0, aug_repeats=1, schedule=BatchSchedule.of(2))
        >>> chain.edits[0].consumed, chain.edits[0].pending  # of the 10 samples of a's epoch 0
        ((6,), (4,))
        >>> seg, src, local = chain.locate(range(30))
        >>> read_a = local[src == 0].tolist()  # source a is source 0 before and after the edit
        >>> sorted(read_a[:10]) == list(range(10))  # its epoch 0: each sample once, read across the edit
        True
    """

    def __init__(self, segments: Sequence[MixSegment], *, seed: int, aug_repeats: int, schedule: BatchSchedule) -> None:
        if not segments or segments[0].step != 0:
            raise ValueError("a chain of mixes starts with the mix of step 0")
        steps = [s.step for s in segments]
        if steps != sorted(set(steps)):
            raise ValueError(f"the edits' steps must ascend, got {steps}")
        self.segments = tuple(segments)
        self.seed, self.aug_repeats, self.schedule = seed, aug_repeats, schedule
        self._draws = schedule.in_draws(aug_repeats)
        self._live: list[_Live] | None = None
        self._edits: list[Edit] = []

    # -- building -----------------------------------------------------------------------------------

    def _build(self) -> list[_Live]:
        if self._live is not None:
            return self._live
        k, seed = self.aug_repeats, self.seed
        first = self.segments[0]
        live = [_Live(first, 0, self._native(first, {}), seed, k, self._draws)]
        edits = []
        for segment in self.segments[1:]:
            old = live[-1]
            q = self.schedule.start(segment.step) // k
            edit, kept = self._edit(old, segment, q)
            edits.append(edit)
            live.append(_Live(segment, q, self._native(segment, kept), seed, k, self._draws))
            _settle(live[-1], kept)
        self._live, self._edits = live, edits
        return live

    def _native(self, segment: MixSegment, kept: Mapping[str, _Queue]) -> list[_Queue]:
        queues: list[_Queue] = []
        for s, source in enumerate(segment.sources):
            if source.name in kept:
                queues.append(kept[source.name])
            elif segment.kind == "plain":  # the epochs' orders: draw j of the stream of passes keyed by the seed
                queues.append(_Stream(source.size, self.seed))
            else:
                queues.append(_Stream(source.size, source_seed(self.seed, s)))
        return queues

    def _edit(self, old: _Live, new: MixSegment, q: int) -> tuple[Edit, dict[str, _Continued]]:
        """What the edit at draw ``q`` leaves each old source, and the kept sources' queues."""
        names = [s.name for s in old.segment.sources]
        now = {s.name: s for s in new.sources}
        for source in old.segment.sources:
            if source.name in now:
                check_kept(source, now[source.name])
        epochs, items, end, resume = old.epoch_of(q)
        found: list[list[npt.NDArray[np.int64]]] = [[] for _ in names]
        counts = [0] * len(names)
        if end == q and old.segment.kind == "steps":  # the rest of each pass, read next (or dropped)
            counts = [(-at) % s.size for at, s in zip(resume, old.segment.sources)]
        for a in range(q, end, _BLOCK):
            block = np.arange(a, min(end, a + _BLOCK), dtype=np.int64)
            src, pos = old.locate(block)
            for s, name in enumerate(names):
                where = src == s
                counts[s] += int(np.count_nonzero(where))
                if name in now:  # only a kept source's items are looked up and held
                    found[s].append(old.queues[s].at(pos[where]))
        kept: dict[str, _Continued] = {}
        for s, name in enumerate(names):
            if name in now:
                pending = np.concatenate(found[s]) if found[s] else np.empty(0, np.int64)
                kept[name] = _Continued(pending, old.queues[s], resume[s])
        consumed = [i - c for i, c in zip(items, counts)]
        edit = Edit(
            new.step, tuple(names), tuple(epochs), tuple(consumed), tuple(counts), tuple(n in now for n in names)
        )
        return edit, kept

    # -- answers ------------------------------------------------------------------------------------

    @property
    def edits(self) -> tuple[Edit, ...]:
        """Each edit: what it left each source of the mix it ended."""
        self._build()
        return tuple(self._edits)

    @property
    def last(self) -> MixSegment:
        """The mix in force now."""
        return self.segments[-1]

    def locate(
        self, draws: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """For each run draw: the segment that made it, its source (in that segment) and its local sample."""
        live = self._build()
        q = np.asarray(draws, np.int64).reshape(-1)
        seg = np.searchsorted(np.array([g.start for g in live], np.int64), q, side="right") - 1
        src = np.empty(q.shape, np.int64)
        local = np.empty(q.shape, np.int64)
        lo, hi = (int(seg.min()), int(seg.max())) if q.size else (0, -1)
        for i in range(lo, hi + 1):
            where = seg == i if lo != hi else slice(None)
            src[where], local[where] = live[i].local(q[where])
        return seg, src, local

    def samples(self, draws: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The global sample numbers of the mix in force now at run draws ``draws``. A draw before the last edit
        of a source it no longer has holds sample 0 (a step before the resume: loaded with its window, never read)."""
        seg, src, local = self.locate(draws)
        offsets = {s.name: o for s, o in zip(self.last.sources, np.cumsum([0, *(s.size for s in self.last.sources)]))}
        out = np.zeros(local.shape, np.int64)
        for i, segment in enumerate(self.segments):
            for s, source in enumerate(segment.sources):
                if source.name not in offsets:
                    continue
                where = (seg == i) & (src == s)
                out[where] = local[where] + int(offsets[source.name])
        return out

    def then(self, segment: MixSegment) -> RemixChain:
        """This chain with ``segment`` in force from its step (which must not precede the last edit; at the last
        edit's step it replaces that edit's mix)."""
        last = self.segments[-1]
        if segment.step < last.step:
            raise ValueError(
                f"a mixture edit at step {segment.step} precedes the run's last edit, at step {last.step}: resume "
                "from a state saved after it"
            )
        kept = self.segments[:-1] if segment.step == last.step and len(self.segments) > 1 else self.segments
        if segment.step == 0:
            kept = ()
        chain = RemixChain((*kept, segment), seed=self.seed, aug_repeats=self.aug_repeats, schedule=self.schedule)
        chain._build()  # raises here on a kept source whose files changed
        return chain

    def to_dict(self) -> list[dict[str, Any]]:
        """The segments as JSON-able dicts (the edits' summaries are recomputed from them)."""
        return [s.to_dict() for s in self.segments]

    @classmethod
    def from_dict(cls, data: Any, *, seed: int, aug_repeats: int, schedule: BatchSchedule) -> RemixChain:
        if not isinstance(data, Sequence) or isinstance(data, (str, bytes)) or not data:
            raise ValueError(f"invalid step state: segments must be a non-empty list, got {data!r}")
        segments = tuple(MixSegment.from_dict(d) for d in data)
        return cls(segments, seed=seed, aug_repeats=aug_repeats, schedule=schedule)

    def digest(self) -> str:
        """A short hash of the chain (with the seed, ``aug_repeats`` and the schedule)."""
        return json_digest(self.to_state())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemixChain) and self.to_state() == other.to_state()

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return f"RemixChain(steps={[s.step for s in self.segments]}, sources={[s.name for s in self.last.sources]})"

    def to_state(self) -> dict[str, Any]:
        """The chain with what it depends on, as a JSON-able dict (what a step layout's dict holds)."""
        return {
            "segments": self.to_dict(),
            "seed": self.seed,
            "aug_repeats": self.aug_repeats,
            "global_batch_size": self.schedule.to_dict(),
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> RemixChain:
        """The chain of :meth:`to_state`. A process that reads the same chain again (a DataLoader worker, at
        each shard) gets the one built before: its pending items are collected once a process."""
        key = json.dumps(data, sort_keys=True)
        chain = _BUILT.get(key)
        if chain is None:
            schedule = BatchSchedule.of(data["global_batch_size"], "the chain's global_batch_size")
            chain = cls.from_dict(
                data["segments"], seed=data["seed"], aug_repeats=data["aug_repeats"], schedule=schedule
            )
            _BUILT.clear()  # one chain a process: a run has one at a time
            _BUILT[key] = chain
        return chain


_BUILT: dict[str, RemixChain] = {}


def _settle(live: _Live, kept: Mapping[str, _Continued]) -> None:
    """Walk the new mix's draws from the edit until each kept source has had a draw for each of its pending
    items: those draws' queue positions read the pending items, in draw order (O(draws walked)). A source that a
    mix by steps gives no draw once its rules and sizes stop changing is walked only that far: what it has not
    drawn by then it never reads."""
    names = [s.name for s in live.segment.sources]
    need = {names.index(n): q.pending.size for n, q in kept.items()}
    found: dict[int, list[npt.NDArray[np.int64]]] = {s: [] for s in need}
    mix, stop = live.segment.mix, None
    if isinstance(mix, StepMix):  # from the last change on, each batch's counts are the same
        schedule = live.draws_schedule
        last = max(live.segment.step, mix.rules[-1][0], schedule.changes[-1][0])
        counts = batch_counts(schedule.size(last), mix.shares(last))
        stop = schedule.start(last + 1)
    q, size = live.start, 1024
    while any(need.values()):
        block = np.arange(q, q + size, dtype=np.int64)
        src, pos = live.locate(block)
        for s, left in need.items():
            if left:
                mine = pos[src == s][:left]
                found[s].append(mine)
                need[s] = left - mine.size
        q += block.size
        size = min(2 * size, _BLOCK)
        if stop is not None and q >= stop:  # past the last change: a source with no draw there has none again
            need = {s: (left if counts[s] else 0) for s, left in need.items()}
    for s, parts in found.items():
        queue = kept[names[s]]
        if queue.pending.size:
            queue.settle(np.concatenate(parts))


def check_kept(old: SourceEntry, new: SourceEntry) -> None:
    """Raise ValueError naming the source if a kept source's files changed (its samples or fingerprint)."""
    changed = None
    if old.size != new.size:
        changed = f"{new.size} samples, {old.size}"
    elif old.fingerprint is not None and new.fingerprint is not None and old.fingerprint != new.fingerprint:
        changed = f"fingerprint {new.fingerprint}, {old.fingerprint}"
    if changed is not None:
        raise ValueError(
            f"mixture edit: source {old.name!r} has {changed} before the edit: its files changed (an edit keeps a "
            "source's files; give the changed files another name to add them as a new source)"
        )
