"""StepSampler.load_state_dict(state, remix=True): random mixes edited at random steps, each part of the run on a
random world size (ranks in one process), against the definition (tests/remix_reference.py); what cannot be
edited, refused by name."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.remix import MixSegment, SourceEntry
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.step_mix import StepMix
from remix_mixes import SEED, SIZES, Mix, dataset, edited_dataset, random_mix, write_files
from remix_reference import Reference

BATCH = 24  # a multiple of every world size tried


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return write_files(tmp_path)


def segment(mix: Mix, step: int) -> MixSegment:
    """The mix as the reference reads it (built here from the Sources, not by the sampler)."""
    kind, sources, epoch_size = mix
    entries = tuple(SourceEntry(s.name, SIZES[s.name[0]], None) for s in sources)
    if kind == "plain":
        return MixSegment(step, "plain", entries, entries[0].size)
    plan = MixPlan.from_sources([e.size for e in entries], sources, epoch_size)
    if kind == "epochs":
        return MixSegment(step, "epochs", entries, plan.epoch_size, plan)
    step_mix = StepMix.from_sources(plan.sizes, sources, plan.epoch_size)
    assert step_mix is not None
    return MixSegment(step, "steps", entries, plan.epoch_size, step_mix)


def run_part(
    mix: Mix, world: int, state: dict[str, Any] | None, stop: int, mini_epoch: int, remix: bool
) -> tuple[list[list[str]], dict[str, Any], StepSampler]:
    """Global batches from the state's step (0 without) to ``stop`` on ``world`` ranks, and the state at ``stop``."""
    per_rank, sampler = [], None
    for r in range(world):
        ds = dataset(mix, r, world, mini_epoch)
        sampler = StepSampler(ds, BATCH)
        if state is not None:
            sampler.load_state_dict(json.loads(json.dumps(state)), remix=remix)  # as saved to a file
        start = sampler.step
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=list)
        per_rank.append([b for _, b in zip(range(start, stop), loader)])
        del loader
    assert sampler is not None
    steps = len(per_rank[0])
    return [[x for p in per_rank for x in p[t]] for t in range(steps)], sampler.state_dict(step=stop), sampler


def expected(reference: Reference, first: int, stop: int) -> list[list[str]]:
    schedule = BatchSchedule.of(BATCH)
    out = []
    for t in range(first, stop):
        items = (reference.item(q) for q in range(schedule.start(t), schedule.start(t + 1)))
        out.append([f"{name[0]}_{i}" for name, i in items])
    return out


@pytest.mark.parametrize("trial", range(6))
def test_random_edits_on_random_world_sizes_equal_the_definition(files: Path, trial: int) -> None:
    rng = random.Random(trial)
    mini_epoch = rng.choice([1, 2, 3])
    worlds = [rng.choice([1, 2, 3, 4, 8]) for _ in range(4)]
    t1, t2 = sorted(rng.sample(range(1, 10), 2))
    t3, end = t2 + rng.randint(0, 3), t2 + 6
    mixes = [random_mix(rng, files)]
    while len(mixes) < 3:  # each an edit: another mix than the one before
        mix = random_mix(rng, files)
        if not segment(mix, 0).same_mix(segment(mixes[-1], 0)):
            mixes.append(mix)
    reference = Reference([segment(m, t) for m, t in zip(mixes, (0, t1, t2))], BatchSchedule.of(BATCH), SEED)
    got, state, _ = run_part(mixes[0], worlds[0], None, t1, mini_epoch, remix=False)
    more, state, sampler = run_part(mixes[1], worlds[1], state, t2, mini_epoch, remix=True)
    got += more
    more, state, sampler = run_part(mixes[2], worlds[2], state, t3, mini_epoch, remix=True)
    got += more
    # Saved after the edits and resumed on another world size, as is (no edit): the same remainder.
    more, state, _ = run_part(mixes[2], worlds[3], state, end, mini_epoch, remix=False)
    got += more
    assert got == expected(reference, 0, end)
    edits = sampler.edits
    assert [e.step for e in edits] == [t1, t2]
    assert [dict(zip(e.names, e.pending)) for e in edits] == reference.pending
    for edit, (_, sources, _) in zip(edits, mixes[1:]):
        kept = {s.name for s in sources}
        assert edit.dropped == {n: p for n, p in zip(edit.names, edit.pending) if n not in kept}


def test_a_source_added_removed_and_reweighted(files: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A source read once an epoch keeps its epoch: what it read before the edit and its first draws after it
    are each of its samples once; the removed source's dropped samples are counted and logged."""
    once = Source(str(files / "d.txt"), repeat=1)
    before: Mix = ("epochs", [once, Source(str(files / "b.txt"), repeat=1)], None)
    after: Mix = ("epochs", [Source(str(files / "a.txt"), weight=1), once], 40)
    got, state, _ = run_part(before, 2, None, 1, 1, remix=False)  # 24 of the 32 items of epoch 0
    read = [x for x in got[0] if x.startswith("d_")]
    with caplog.at_level(logging.INFO, logger="rank_dataset.steps"):
        more, _, sampler = run_part(after, 4, state, 4, 1, remix=True)
    (edit,) = sampler.edits
    assert edit.names == ("d.txt", "b.txt") and edit.kept == (True, False)
    manifest = sampler.manifest()  # the run's mixes, each from its step (samples_of: test_provenance_remix.py)
    assert [s["step"] for s in manifest["steps"]["segments"]] == [0, 1]
    assert edit.consumed[0] == len(read) and edit.pending[0] == 20 - len(read)
    assert edit.dropped == {"b.txt": 12 - sum(x.startswith("b_") for x in got[0])}
    then = [x for b in more for x in b if x.startswith("d_")]
    assert sorted(read + then[: edit.pending[0]]) == sorted(f"d_{i}" for i in range(20))
    assert f"'b.txt' {edit.dropped['b.txt']}" in caplog.text and "mixture edit at step 1" in caplog.text
    reference = Reference([segment(before, 0), segment(after, 1)], BatchSchedule.of(BATCH), SEED)
    assert got + more == expected(reference, 0, 4)


def test_what_an_edit_cannot_do_is_refused_by_name(files: Path) -> None:
    one: Mix = ("epochs", [Source(str(files / "a.txt")), Source(str(files / "b.txt"))], None)
    two: Mix = ("epochs", [Source(str(files / "a.txt")), Source(str(files / "c.txt"))], None)
    _, state, _ = run_part(one, 1, None, 2, 1, remix=False)
    sampler = StepSampler(dataset(two, 0, 1, 1), BATCH)
    with pytest.raises(ValueError, match=r"this step state is for another .*load_state_dict\(state, remix=True\)"):
        sampler.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot change the aug_repeats"):
        ds = RankDataset(two[1], reload_cfg={"seed": SEED, "aug_repeats": 2}, rank=0, world_size=1)
        StepSampler(ds, BATCH).load_state_dict(state, remix=True)
    with pytest.raises(ValueError, match="cannot change the global batch size schedule"):
        StepSampler(dataset(two, 0, 1, 1), {0: BATCH, 5: 2 * BATCH}).load_state_dict(state, remix=True)
    (files / "a.txt").write_text("".join(f"a_{i}x\n" for i in range(SIZES["a"])))  # same lines count, other bytes
    with pytest.raises(ValueError, match=r"source 'a\.txt' has fingerprint .* before the edit: its files changed"):
        StepSampler(dataset(two, 0, 1, 1), BATCH).load_state_dict(state, remix=True)
    with pytest.raises(ValueError, match="step 1 precedes this run's mixture edit at data batch 2"):
        (files / "a.txt").write_text("".join(f"a_{i}\n" for i in range(SIZES["a"])))
        sampler = StepSampler(dataset(two, 0, 1, 1), BATCH)
        sampler.load_state_dict(state, remix=True)
        sampler.state_dict(step=1)


@pytest.mark.slow  # torchrun jobs
def test_a_two_rank_gloo_job_with_workers_edits_its_mix_at_a_resume(files: Path, tmp_path: Path) -> None:
    from remix_worker import BATCH as JOB_BATCH
    from remix_worker import CFG as JOB_CFG
    from tests_helpers import rank_results, run_ranks, worker_env

    def job(mix: str, stop: int) -> tuple[list[list[str]], list[dict[str, Any]]]:
        out = tmp_path / mix
        proc = run_ranks(
            "remix_worker.py", 2, mix, files, out, tmp_path / "state.json", stop, env=worker_env(), timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = rank_results(out, 2)
        return [[x for r in results for x in r["batches"][t]] for t in range(len(results[0]["batches"]))], results

    edit, stop = 5, 14  # edit inside an epoch of the first mix (60 of its 40-item epochs), the rules change at 9
    head, _ = job("before", edit)
    tail, results = job("after", stop)
    assert [r["start"] for r in results] == [edit, edit]
    # The reference: the two mixes as the plan reads them, walked draw by draw.
    before = edited_dataset("before", str(files), JOB_CFG)._book.mixture
    after = edited_dataset("after", str(files), JOB_CFG)._book.mixture
    assert before is not None and after is not None
    entries = [tuple(SourceEntry(s.name, n, None) for s, n in zip(m.sources, m.plan.sizes)) for m in (before, after)]
    step_mix = StepMix.from_sources(after.plan.sizes, after.sources, after.plan.epoch_size)
    assert step_mix is not None
    segments = [
        MixSegment(0, "epochs", entries[0], before.plan.epoch_size, before.plan),
        MixSegment(edit, "steps", entries[1], after.plan.epoch_size, step_mix),
    ]
    reference = Reference(segments, BatchSchedule.of(JOB_BATCH), JOB_CFG["seed"])
    schedule = BatchSchedule.of(JOB_BATCH)
    want = [
        [f"{n[0]}_{i}" for n, i in (reference.item(q) for q in range(schedule.start(t), schedule.start(t + 1)))]
        for t in range(stop)
    ]
    assert head + tail == want
    (pending,) = reference.pending
    assert all(r["dropped"] == {str(edit): {"b.txt": pending["b.txt"]}} for r in results)
    assert pending["b.txt"] > 0 and pending["a.txt"] > 0  # the edit drops some of b and owes some of a
