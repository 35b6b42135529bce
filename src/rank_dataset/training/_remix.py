"""A StepSampler's side of mixture edits (:mod:`rank_dataset.plan.remix`): its dataset's mix as a segment, and a
saved state's chain of mixes continued by it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from rank_dataset.plan.remix import Edit, MixSegment, RemixChain, SourceEntry
from rank_dataset.plan.step_state import StepState
from rank_dataset.plan.steps import StepLayout
from rank_dataset.training._manifest import path_text
from rank_dataset.training._state import fingerprint_of
from rank_dataset.training.dataset import RankDataset

__all__ = ["SEGMENTS_KEY", "continue_chain", "log_edit", "saved_chain", "segment_of", "state_chain"]

logger = logging.getLogger("rank_dataset.steps")

#: The key of a step state that holds the run's chain of mixes.
SEGMENTS_KEY = "segments"


def segment_of(dataset: RankDataset, layout: StepLayout, step: int = 0) -> MixSegment:
    """The mix of ``dataset`` (read by ``layout``) as a segment in force from ``step``. A source's identity is its
    name (a Source's, which defaults to its first file's base name; plain files: their first file's base name)."""
    book, spec = dataset._book, dataset.spec
    mixture = book.mixture
    everywhere = book.exclusion_fingerprint is not None  # exclude= lists the samples of every source
    if mixture is None:
        meta = getattr(dataset.reader, "meta", None)
        paths = getattr(meta, "paths", ())
        first = str(paths[0]) if paths else "meta file"
        name = os.path.basename(first) or first
        files = fingerprint_of(dataset.reader, None, book.exclusion_fingerprint)
        columns = list(getattr(meta, "columns", None) or [None])
        entry = SourceEntry(
            name,
            spec.num_samples,
            files,
            tuple(path_text(p) for p in paths) if paths else None,
            columns[0] if all(c == columns[0] for c in columns) else None,
            everywhere,
        )
        return MixSegment(step, "plain", (entry,), spec.num_samples)
    plan = mixture.plan
    sources = tuple(
        SourceEntry(
            s.name,
            n,
            f,
            tuple(path_text(p) for p in s.paths),
            None if s.columns is None else tuple(s.columns),
            everywhere or s.ids is not None or s.exclude is not None,
        )
        for s, n, f in zip(mixture.sources, plan.sizes, mixture.fingerprints)
    )
    if layout.mix is not None:
        return MixSegment(step, "steps", sources, plan.epoch_size, layout.mix)
    return MixSegment(step, "epochs", sources, plan.epoch_size, plan)


def state_chain(layout: StepLayout, dataset: RankDataset, identity: StepState) -> RemixChain:
    """The chain a state saved now records: the layout's, or the dataset's mix from step 0."""
    if layout.remix is not None:
        return layout.remix
    return RemixChain(
        (segment_of(dataset, layout),),
        seed=identity.seed,
        aug_repeats=identity.aug_repeats,
        schedule=identity.schedule,
    )


def saved_chain(found: Mapping[str, Any], saved: StepState) -> RemixChain | None:
    """The chain of mixes a state holds (None: a state saved without one)."""
    segments = found.get(SEGMENTS_KEY)
    if segments is None:
        return None
    return RemixChain.from_dict(segments, seed=saved.seed, aug_repeats=saved.aug_repeats, schedule=saved.schedule)


def continue_chain(
    found: Mapping[str, Any], saved: StepState, identity: StepState, dataset: RankDataset, layout: StepLayout
) -> RemixChain | None:
    """The chain of a run that resumes state ``found`` at its step with ``dataset``'s mix (``remix=True``): the
    state's chain, with the dataset's mix from the state's step on if it differs. None: the mix never changed.

    Raises:
        ValueError: what an edit cannot change (naming it): the seed, ``aug_repeats``, the batch size schedule,
            batches by shape, a kept source's files; a state with no chain of mixes.
    """
    for field, what in (("seed", "seed"), ("aug_repeats", "aug_repeats"), ("schedule", "global batch size schedule")):
        if getattr(saved, field) != getattr(identity, field):
            a, b = getattr(saved, field), getattr(identity, field)
            raise ValueError(
                f"a mixture edit (remix=True) cannot change the {what}: the state has {a!r}, this run {b!r}"
            )
    if saved.shapes is not None or identity.shapes is not None:
        raise ValueError("a mixture edit (remix=True) does not take batches by shape (bucket_by, max_cost)")
    old = saved_chain(found, saved)
    if old is None:
        raise ValueError(
            "this step state records no chain of mixes (saved by an earlier rank_dataset): a mixture edit "
            "(remix=True) needs one; resume it on its own mix first and save a new state"
        )
    new = segment_of(dataset, layout, saved.step)
    if old.last.same_mix(new):
        return old if len(old.segments) > 1 else None
    chain = old.then(new)
    edit = chain.edits[-1] if len(chain.segments) > 1 and chain.last.step == saved.step else None
    if edit is not None:
        log_edit(edit)
    return chain


def log_edit(edit: Edit) -> None:
    """One log line of what an edit did: the kept sources' pending items and the removed ones' dropped."""
    kept = ", ".join(f"{n!r} {p}" for n, p, k in zip(edit.names, edit.pending, edit.kept) if k) or "none"
    dropped = edit.dropped
    gone = ", ".join(f"{n!r} {p}" for n, p in dropped.items()) or "none"
    level = logging.WARNING if any(dropped.values()) else logging.INFO
    logger.log(
        level,
        "mixture edit at step %d: pending items read first: %s; removed sources' samples dropped: %s (%d in all)",
        edit.step,
        kept,
        gone,
        sum(dropped.values()),
    )
