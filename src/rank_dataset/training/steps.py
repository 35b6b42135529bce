"""StepSampler: an endless stream of global batches, the same for any world size, with exact resume.

The arithmetic is :mod:`rank_dataset.plan.steps`; this module moves the dataset from one shard to the next.
Each shard (a window of the stream) is one pass of the shard channel. At a window's end the sampler loads the
next shard at once (the workers still read the batches in flight from the old one, which the channel keeps),
waits until the workers have read every item of the old pass, and only then starts the new pass: no batch is
read from the wrong shard, and the wait overlaps the load.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.core.checks import check_int
from rank_dataset.plan.consumed import ANCHOR_KEY, RunCounter, check_anchor
from rank_dataset.plan.remix import Edit, RemixChain
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.shapes import ShapeLayout, ShapeStream, bucket_ids
from rank_dataset.plan.skips import Skips
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.step_state import StepState, find_step_state, mix_digest
from rank_dataset.plan.steps import StepLayout, check_stream
from rank_dataset.training._remix import SEGMENTS_KEY, continue_chain, saved_chain, state_chain
from rank_dataset.training._state import fingerprint_of
from rank_dataset.training.dataset import RankDataset

__all__ = ["StepSampler", "find_step_state"]


def _shape_layout(dataset: RankDataset, size: Any, bucket_by: Any, max_cost: Any, cost: Any) -> ShapeLayout:
    """The layout of batches by shape over ``dataset``'s samples (see :class:`StepSampler`)."""
    spec, book = dataset.spec, dataset._book
    if book.mixture is not None or book.exclusion_fingerprint is not None:
        raise ValueError(
            "batches by shape (bucket_by, max_cost) take the buckets and costs of a dataset's samples: not a mix "
            "nor exclude= (group the samples you keep into buckets of their own)"
        )
    if book.policy.on_error == "replace":
        # A substitute is drawn from the positions of the rank's stream, which a worker cannot compute from the
        # layout's digest alone: refused here rather than failing inside a DataLoader worker.
        raise ValueError(
            "batches by shape (bucket_by, max_cost) do not take on_error='replace' yet: use on_error='raise' "
            "(or exclude the bad samples with exclude= before bucketing)"
        )
    if max_cost is None:
        if size is None or isinstance(size, Mapping):
            raise ValueError(f"bucket_by takes one global_batch_size (an int), got {size!r}")
    elif size is not None:
        raise ValueError(f"with max_cost the sizes follow the costs: global_batch_size must be None, got {size!r}")
    n = spec.num_samples
    buckets = None if bucket_by is None else bucket_ids(bucket_by, n)
    stream = ShapeStream(n, spec.seed, buckets, batch_size=size, max_cost=max_cost, cost=cost)
    stream.check(spec.world_size, spec.aug_repeats)
    return ShapeLayout(stream)


_SWITCH_TIMEOUT = 600.0  # seconds a shard change waits for the workers to read the old shard's batches


class StepSampler(Sampler[list[int]]):
    """An endless batch sampler: at step ``t`` it yields this rank's ``B(t) / W`` indices of global batch ``t``.

    Global batch ``t`` is the same samples in the same order on any world size ``W`` that divides every size:
    the ranks' batches of a step, concatenated in rank order, are one list, the stream's items ``[S(t), S(t) +
    B(t))`` (see :mod:`rank_dataset.plan.steps`). The stream is the epochs' orders back to back, each sample
    once an epoch; the sampler moves to the next mini-epoch and epoch by itself. Use it as
    ``DataLoader(ds, batch_sampler=StepSampler(ds, 256))`` and loop with
    ``for step, batch in zip(range(start, max_steps), loader)``.

    For a mix in which a source has a rule by step (``Source(..., weight={0: 1, 5000: 3}, by="step")``, or a
    ``repeat`` or ``choose`` by step), each global batch takes of each source its largest-remainder share of
    ``B(t)`` (of its ``B(t) / k`` draws with ``aug_repeats=k``) in proportion to the per-epoch counts of the
    rules in force at step ``t`` (:mod:`rank_dataset.plan.step_mix`).

    Batches by shape (:mod:`rank_dataset.plan.shapes`): with ``bucket_by``, every global batch holds samples of
    one bucket; with ``max_cost`` and ``cost`` (``global_batch_size=None``), each global batch is a run of the
    order whose total cost fits ``max_cost``, split among the ranks by cost. Either way global batch ``t`` is the
    same samples on any world size, and a state resumes it on any world size.

    Args:
        dataset: a RankDataset (train mode; any reader, mix, subsets, ``exclude=``, ``aug_repeats``; by shape:
            plain files, without a mix, ``exclude=`` nor ``aug_repeats``).
        global_batch_size: an int, or a schedule ``{first_step: size}`` that holds step 0 (a ramp-up); each size
            a multiple of the world size (and of ``aug_repeats``). With ``bucket_by``, an int; with ``max_cost``,
            None.
        start_step: the first loop step to yield a batch for (its data batch: see ``skip``).
        bucket_by: each sample's bucket: the dict :func:`~rank_dataset.group_by` returns (label -> sample
            indices) or an int array of the dataset's samples (see
            :func:`~rank_dataset.plan.shapes.aspect_ratio_groups` and
            :func:`~rank_dataset.plan.shapes.nearest_resolution`).
        max_cost: the cost budget of a global batch (an int), with ``cost``.
        cost: each sample's cost, a non-negative integer array of the dataset's samples (pixels, tokens).
        skip: data batches not trained on, as half-open ranges ``[(a, b), ...]`` (see :meth:`skip`).

    Loop steps and data batches (:mod:`rank_dataset.plan.skips`): global batch ``t`` above is data batch ``t``,
    and the batch-size and mixture schedules are keyed by the data batch. ``start_step``, :attr:`step` and
    ``state_dict(step=)`` count loop (optimizer) steps: without skips the two are equal; with a skipped range
    ``[a, b)``, the loop step that would have received data batch ``a`` receives data batch ``b``.

    ``state_dict()`` is ``{"step": next step, ...}`` plus what identifies the stream, the same on every rank;
    torchdata's StatefulDataLoader stores it, taken at the batch last returned (with a plain DataLoader, which
    reads ahead, call ``state_dict(step=next_step)``). ``load_state_dict`` takes it on any world size that
    divides the sizes and any number of workers.

    Raises:
        TypeError: not a RankDataset (the meta server's datasets are not read by steps).
        ValueError: a size that is not a multiple of the world size (naming the step and the size), an eval
            dataset, ``exclude_failures=True`` or ``audit="off"`` (the shard change needs the pass counts); in a
            mix with rules by step, a source with a schedule by epoch or rules that cannot be met at some step
            (naming the source and the step). By shape: a sample costlier than ``max_cost`` (naming it), a
            bucket for other samples, a mix, ``exclude=`` or ``aug_repeats``; when the stream reaches it, a
            global batch of fewer samples than the world size (naming the step). ``skip``: an empty range, or two
            different ranges that overlap.
    """

    def __init__(
        self,
        dataset: RankDataset,
        global_batch_size: int | Mapping[int, int] | None,
        *,
        start_step: int = 0,
        bucket_by: Any = None,
        max_cost: int | None = None,
        cost: Any = None,
        skip: Any = None,
    ) -> None:
        if not isinstance(dataset, RankDataset):
            raise TypeError(
                f"dataset must be a RankDataset, got {type(dataset).__name__} (the meta server's datasets, "
                "RankServerDataset and ServerDataset, are not read by steps)"
            )
        spec = dataset.spec
        if spec.is_test:
            raise ValueError("StepSampler reads a training stream: the dataset is an eval one (is_test=True)")
        if dataset.channel.audit_mode == "off":
            raise ValueError(
                "StepSampler changes shards by the pass audit's counts: build the dataset with audit='warn' or 'error'"
            )
        if dataset._book.policy.exclude_failures:
            raise ValueError(
                "exclude_failures=True changes the plan each epoch by what failed, which depends on the world size "
                "(substitutes are drawn from the rank's shard): a stream by steps cannot take it; leave failing "
                "samples out with exclude= (ds.failures lists them)"
            )
        book = dataset._book
        mixture = book.mixture
        self.dataset = dataset
        self.layout: StepLayout
        if bucket_by is None and max_cost is None and cost is None:
            schedule = BatchSchedule.of(global_batch_size)
            schedule.check(spec.world_size, spec.aug_repeats)
            step_mix = None
            if mixture is not None:
                step_mix = StepMix.from_sources(mixture.plan.sizes, mixture.sources, mixture.plan.epoch_size)
            self.layout = StepLayout(schedule, step_mix)
        else:
            self.layout = _shape_layout(dataset, global_batch_size, bucket_by, max_cost, cost)
            schedule = self.layout.schedule
        self._step = check_int("start_step", start_step, low=0)
        self._skips = Skips.of(skip)
        self.started_at: int | None = None  # the first step of the latest iteration (what a monitor counts from)
        self._counter: RunCounter | None = None
        self._anchor: Any = None  # a loaded state's counts of its epoch in progress (taken by the next counter)
        self._chain: RemixChain | None = None  # the dataset's mix as the one segment of an unedited run
        self._timeout = _SWITCH_TIMEOUT
        files = fingerprint_of(dataset.reader, mixture, book.exclusion_fingerprint)
        self._identity = StepState(
            step=0,
            num_samples=spec.num_samples,
            fingerprint=files,
            seed=spec.seed,
            aug_repeats=spec.aug_repeats,
            schedule=schedule,
            # The mix's counts and its rules by step, not the batch sizes: a state for other sizes names the schedule.
            mix=None if mixture is None else mix_digest({**mixture.plan.to_dict(), "steps": self._rules()}),
            shapes=self.layout.shapes,
        )

    def _rules(self) -> dict[str, Any] | None:
        """The mix's rules by step, as the state's digest records them (None: a mix by epochs)."""
        return None if self.layout.mix is None else self.layout.mix.to_dict()

    @property
    def schedule(self) -> BatchSchedule:
        """The global batch size by step."""
        return self.layout.schedule

    @property
    def step(self) -> int:
        """The next loop step this sampler yields a batch for (its data batch: ``skips.batch_of(step)``)."""
        return self._step

    @property
    def skips(self) -> Skips:
        """The data batches not trained on (:class:`~rank_dataset.plan.skips.Skips`)."""
        return self._skips

    def skip(self, first: int, stop: int) -> None:
        """Do not train on data batches ``[first, stop)``: the loop step that would have received batch
        ``first`` receives batch ``stop``. Call it on every rank alike (the ranks' batches must stay one global
        batch); it is kept in :meth:`state_dict` and :meth:`manifest`.

        Raises:
            ValueError: ``first`` before the next data batch not yet handed out (the sampler runs ahead of the
                loop by the DataLoader's prefetch), an empty range, or one that overlaps another skipped range.
        """
        merged = self._skips.merge(Skips.of([(first, stop)]))
        if merged is self._skips:  # the same range again counts once
            return
        upcoming = self._skips.batch_of(self._step)
        if first < upcoming:
            raise ValueError(
                f"skip({first}, {stop}): data batches up to {upcoming - 1} have been handed out (the sampler runs "
                f"ahead of the training loop by the DataLoader's prefetch): skip from data batch {upcoming} on"
            )
        self._skips = merged

    def manifest(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """What defines this stream, as a small JSON dict naming no rank: the dataset's manifest
        (:meth:`RankDataset.manifest`) with the batch-size schedule, the mix's rules by step, the buckets and
        budgets of batches by shape, and the skipped ranges. With ``path``, written there as JSON, the arrays it
        references beside it. :func:`rank_dataset.samples_of` reads it.

        After mixture edits (:attr:`edits`) the top level is the mix in force now, and ``steps.segments`` every
        mix of the run from its first data batch (an earlier mix's sources with their files), ``steps.edits``
        what each edit left each source (its epoch in progress, items consumed and pending, kept or dropped).

        Raises:
            ValueError: after an edit, a source of an earlier mix that read a listing of its files (``ids=``,
                ``exclude=``) which this dataset no longer holds (the arrays are not in this process).
        """
        from rank_dataset.training._manifest import dataset_manifest

        ds = self.dataset
        return dataset_manifest(ds.spec, ds._book, ds.meta, ds.reload_cfg.epoch_size, path, (self.layout, self._skips))

    def global_batch_size(self, step: int) -> int:
        """``B`` of the data batch that loop step ``step`` receives."""
        return self.schedule.size(self._skips.batch_of(check_int("step", step, low=0)))

    def _window(self, step: int) -> tuple[int, int]:
        spec = self.dataset.spec
        return self.layout.window_of(step, spec.num_samples, spec.mini_epoch, spec.aug_repeats)

    def __iter__(self) -> Iterator[list[int]]:
        ds, schedule = self.dataset, self.schedule
        channel = ds.channel
        token = drawn = 0
        try:
            self.started_at = self._step
            while True:
                step = self._skips.batch_of(self._step)  # the next data batch
                check_stream(ds.spec.num_samples, schedule, step)
                epoch, mini = self._window(step)
                spec = ds.spec
                if spec.steps != self.layout or (spec.epoch, spec.mini_epoch_idx) != (epoch, mini):
                    ds.use_steps(self.layout, epoch, mini)  # workers still serve the open pass's shard
                    spec = ds.spec
                if token:
                    self._drain(token, drawn)
                    channel.end_pass(token, finished=True)
                    token = 0
                first, stop = self.layout.steps_of(spec.num_samples, spec.mini_epoch, epoch, mini, spec.aug_repeats)
                bounds = self._bounds(first, stop)
                seen = self._skips
                token = channel.begin_pass(seen.kept_items(bounds, first, step))
                drawn = 0
                u = step
                while u < stop:
                    self._step += 1  # what state_dict says while this batch is out
                    lo, hi = int(bounds[u - first]), int(bounds[u - first + 1])
                    drawn += hi - lo
                    yield list(range(lo, hi))
                    u = self._skips.batch_of(self._step)
                    if self._skips is not seen:  # skip() since the pass began: it draws fewer
                        seen = self._skips
                        channel.pass_audit.begin(drawn + (seen.kept_items(bounds, first, u) if u < stop else 0))
        finally:
            if token:
                channel.end_pass(token, finished=False)

    def _bounds(self, first: int, stop: int) -> npt.NDArray[np.int64]:
        """Where each global batch ``[first, stop)`` of one window starts in this rank's shard, and its end."""
        spec = self.dataset.spec
        if isinstance(self.layout, ShapeLayout):
            counts = self.layout.counts(spec.world_size, spec.rank, first, stop)
        else:
            counts = np.empty(stop - first, np.int64)
            for a, z, size, _ in self.schedule.segments(first, stop):
                counts[a - first : z - first] = size // spec.world_size
        return prefix_sums(counts)

    def _drain(self, token: int, drawn: int) -> None:
        """Wait until the items of pass ``token`` (``drawn`` of them) have all been read, by the DataLoader's
        workers or the rank: the batches in flight then no longer need the old shard."""
        channel = self.dataset.channel
        deadline = time.monotonic() + self._timeout
        delay = 1e-4
        while True:
            read = next((c.read for c in reversed(channel.audit()) if c.number == token), 0)
            if read is None:  # a worker could not count (past the channel's table, or its read raised): no wait
                warnings.warn("StepSampler: a DataLoader worker could not count its reads", RuntimeWarning, 2)
                return
            if read >= drawn:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"StepSampler: {drawn - read} of the {drawn} items handed out from the last shard were not read "
                    f"within {self._timeout:.0f} s of the shard change. Read the batches (a DataLoader, or ds[i] for "
                    "each index) as the sampler yields them: it starts the next shard once they are all read."
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """The resume point: ``step`` (a loop step; default: the next step this sampler yields; with a plain
        DataLoader, which prefetches, pass the next step the training loop reads), what identifies the stream
        and the skipped ranges (``skip``, when there are any). A JSON dict of a few hundred bytes, the same on
        every rank."""
        step = self._step if step is None else check_int("step", step, low=0)
        state = dataclasses.replace(self._identity, step=step).to_dict()
        layout = self.layout
        anchor = layout.stream.anchor_of(self._skips.batch_of(step)) if isinstance(layout, ShapeLayout) else None
        if anchor is not None:  # by budget: the batches before an epoch and the runs carried into it (no replay)
            state["anchor"] = list(anchor)
        if self._skips:
            state["skip"] = self._skips.to_list()
        if not isinstance(self.layout, ShapeLayout):  # the mixes, for a mixture edit at a resume (remix=True)
            chain = self._state_chain()
            batch = self._skips.batch_of(step)  # a chain's steps count data batches, as the schedules do
            if batch < chain.last.step:
                raise ValueError(f"step {step} precedes this run's mixture edit at data batch {chain.last.step}")
            state[SEGMENTS_KEY] = chain.to_dict()
            counted = self._run_counter().anchor_at(batch)
            if counted is not None:  # so that a resume counts the epoch in progress from here, not its start
                state[ANCHOR_KEY] = counted
        return state

    def _state_chain(self) -> RemixChain:
        if self.layout.remix is not None:
            return self.layout.remix
        if self._chain is None:
            self._chain = state_chain(self.layout, self.dataset, self._identity)
        return self._chain

    @property
    def edits(self) -> tuple[Edit, ...]:
        """The run's mixture edits (:meth:`load_state_dict` with ``remix=True``), each with what it left each source
        of the mix it ended: its epoch in progress, items consumed and pending, and whether it was kept
        (:attr:`~rank_dataset.plan.remix.Edit.dropped`: the removed sources' samples dropped)."""
        return () if self.layout.remix is None else self.layout.remix.edits

    @property
    def source_names(self) -> list[str]:
        """The names :meth:`consumed` counts by: the mix's sources in order (a name given twice gets ``#i``,
        its number), or ``["all"]`` without a mix."""
        mixture = self.dataset._book.mixture
        if mixture is None:
            return ["all"]
        names = [s.name for s in mixture.sources]
        return [f"{n}#{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]

    def consumed(self, step: int | None = None) -> dict[str, Any]:
        """The items of each source in the global batches trained on before loop step ``step`` (default: the
        batches handed out; with a plain DataLoader, which prefetches, pass the next step the training loop
        reads), computed from the plan (:mod:`rank_dataset.plan.consumed`): exact, the same on every rank and
        world size, skipped data batches left out. An item is an entry of a global batch (with ``aug_repeats``,
        each copy). ``{"step": step, "sources": {name: items}, "epochs": [{name: items}, ...]}``, ``epochs[e]``
        the items of the stream's epoch ``e``.

        With mixture edits (:attr:`edits`), ``sources`` holds every source the run read (named as the edits match
        them) and ``"segments"`` is each mix's ``{"batch": its first data batch, "sources", "epochs"}`` (an epoch
        that an edit cut short is a row of its own); ``epochs`` is their rows in order."""
        step = self._step if step is None else check_int("step", step, low=0)
        batch = self._skips.batch_of(step)  # counts follow data batches; skipped ones were not trained on
        parts = self._run_counter().per_segment(self._skips.trained(batch))
        chain = self.layout.remix
        names_of = [self.source_names] if chain is None else [[s.name for s in g.sources] for g in chain.segments]
        totals: dict[str, int] = {}
        epochs: list[dict[str, int]] = []
        segments = []
        for (first, rows), names in zip(parts, names_of):
            table = [dict(zip(names, row)) for row in rows.tolist()]
            mine = {n: int(c) for n, c in zip(names, rows.sum(axis=0).tolist() if len(rows) else [0] * len(names))}
            for name, count in mine.items():
                totals[name] = totals.get(name, 0) + count
            epochs += table
            segments.append({"batch": first, "sources": mine, "epochs": table})
        out: dict[str, Any] = {"step": step, "sources": totals, "epochs": epochs}
        if chain is not None:
            out["segments"] = segments
        return out

    def _run_counter(self) -> RunCounter:
        if self._counter is None:
            spec, mixture = self.dataset.spec, self.dataset._book.mixture
            mix = None if mixture is None else mixture.plan
            self._counter = RunCounter(self.layout, spec.num_samples, spec.seed, spec.aug_repeats, mix)
            if self._anchor is not None:
                self._counter.seed(self._anchor)
        return self._counter

    @staticmethod
    def find_state(loader_state: Mapping[str, Any]) -> dict[str, Any]:
        """The StepSampler state inside a (torchdata StatefulDataLoader's) nested state, or the state itself.

        Raises:
            ValueError: none in it.
        """
        found = find_step_state(loader_state)
        if found is None:
            raise ValueError("no StepSampler state in this dict: was the sampler a StepSampler?")
        return found

    def load_state_dict(self, state: Mapping[str, Any], remix: bool = False) -> None:
        """Continue at the state's step (the next iteration yields that global batch). ``state`` is one of
        :meth:`state_dict`, or a dict holding one (a StatefulDataLoader's state: any number of workers).

        With ``remix=True`` the dataset's mix may differ from the state's (a source added, removed or reweighted,
        rules by step changed): the run goes on with it from the state's step, each kept source first reading
        what its epoch in progress had not given yet (see :mod:`rank_dataset.plan.remix` and :attr:`edits`; a
        log line of the logger ``rank_dataset.steps`` reports the removed sources' dropped samples).

        Raises:
            ValueError: a state for other files, another seed, ``aug_repeats``, mix or schedule (naming it); with
                ``remix=True``, an edit it cannot make (a kept source's files changed, ``aug_repeats``, the seed,
                the batch size schedule, batches by shape; naming it); a skipped range of the state that overlaps
                a different one of this sampler's (the state's skips are merged with the sampler's: the same range
                in both counts once).
        """
        found = self.find_state(state)
        saved = StepState.from_dict(found)
        counted = found.get(ANCHOR_KEY)
        if counted is not None:
            check_anchor(counted)
        skips = self._skips.merge(Skips.of(found.get("skip"), "the state's skip"))
        layout = dataclasses.replace(self.layout, remix=None) if not isinstance(self.layout, ShapeLayout) else None
        now = self._identity
        same_mix = (saved.mix, saved.num_samples, saved.fingerprint) == (now.mix, now.num_samples, now.fingerprint)
        if remix and layout is not None and not same_mix:
            # the edit takes effect at the state's data batch (a chain counts data batches, not loop steps)
            at = dataclasses.replace(saved, step=skips.batch_of(saved.step))
            chain = continue_chain(found, at, now, self.dataset, layout)
            self.layout = dataclasses.replace(layout, remix=chain)
            self._step, self._skips = saved.step, skips
            self._counter, self._anchor = None, counted  # the counts follow the layout loaded
            return
        try:
            saved.check_same_stream(now)
        except ValueError as exc:
            if same_mix or layout is None:  # (batches by shape take no mixture edit)
                raise
            raise ValueError(f"{exc}; to change the mix at this resume: load_state_dict(state, remix=True)") from None
        if layout is not None:  # the state's edits, if any, go on
            chain = saved_chain(found, saved)
            self.layout = dataclasses.replace(layout, remix=chain if chain and len(chain.segments) > 1 else None)
        anchor = found.get("anchor")
        if anchor is not None and isinstance(self.layout, ShapeLayout):
            if not (isinstance(anchor, list) and len(anchor) == 3 and isinstance(anchor[2], list)):
                raise ValueError(
                    "invalid step state: anchor must be [epoch, steps before it, [each bucket's carried samples]], "
                    f"got {anchor!r}"
                )
            self.layout.stream.anchor(*anchor)
        self._step, self._skips = saved.step, skips
        self._counter, self._anchor = None, counted
