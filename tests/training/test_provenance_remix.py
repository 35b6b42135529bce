"""What a run with mixture edits trained on: random mixes edited at random steps, with skipped ranges, each part
resumed on a random world size (ranks in one process); the manifest's samples_of against what the ranks'
DataLoaders yielded step by step, consumed() against the lines counted, kept sources' epochs read whole across an
edit; and a resume's counts of the epoch in progress taken from the state."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler, samples_of
from rank_dataset.plan.mix import MixPlan
from rank_dataset.shards.provenance import RunPlan
from remix_mixes import SIZES, Mix, dataset, random_mix, write_files

pytestmark = pytest.mark.filterwarnings("error::rank_dataset.PassAuditWarning")  # skips keep the audit exact

BATCH = 24  # a multiple of every world size tried
REPEATED_RULES, WHOLE_REPEATS = ("weight", "repeat", "repeat", "choose"), (1, 1, 2)


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return write_files(tmp_path)


def run_part(
    mix: Mix, world: int, state: dict[str, Any] | None, stop: int, mini_epoch: int, skip: Any
) -> tuple[list[list[list[str]]], dict[str, Any], list[StepSampler]]:
    """Loop steps from the state's (0 without) to ``stop`` on ``world`` ranks, each with DataLoader workers on
    rank 0 (``remix=True`` at the resume): each rank's batches, the state at ``stop`` and the samplers."""
    per_rank, samplers = [], []
    for r in range(world):
        ds = dataset(mix, r, world, mini_epoch)
        sampler = StepSampler(ds, BATCH, skip=skip)
        if state is not None:
            sampler.load_state_dict(json.loads(json.dumps(state)), remix=True)  # as saved to a file
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=1 if r == 0 else 0)
        per_rank.append([b for _, b in zip(range(sampler.step, stop), loader)])
        samplers.append(sampler)
        del loader
    states = [s.state_dict(step=stop) for s in samplers]
    assert all(s == states[0] for s in states)
    return per_rank, states[0], samplers


def whole(per_rank: list[list[list[str]]]) -> list[list[str]]:
    return [[x for p in per_rank for x in p[t]] for t in range(len(per_rank[0]))]


def check_kept_epochs(sampler: StepSampler, stream: list[str]) -> int:
    """Each kept source whose epoch in progress at an edit is one whole pass over its samples: what it read of
    that epoch before the edit and its first draws after it are each of its samples once. A source's queue is
    its passes back to back, from an offset (``shift``) after an edit: the pending items end a pass, and the rest
    of the old queue goes on from the end of its epoch. The number of (edit, source) pairs checked."""
    chain = sampler.layout.remix
    assert chain is not None
    shifts: dict[str, int | None] = {}  # each source's pass boundaries in the queue of the segment in force
    checked = 0
    for i, edit in enumerate(chain.edits):
        old = chain.segments[i]
        if i == 0:
            shifts = {s.name: 0 for s in old.sources}
        origin, q = old.step * BATCH, edit.step * BATCH  # k = 1, one batch size: draws are items
        after_edit: dict[str, int | None] = {}
        for s, (name, epoch, consumed, pending) in enumerate(zip(edit.names, edit.epoch, edit.consumed, edit.pending)):
            size, shift = old.sources[s].size, shifts.get(name)
            if old.kind == "steps" or shift is None:
                continue
            start = old.mix.stream_starts(epoch)[s] if isinstance(old.mix, MixPlan) else epoch * size
            end = old.mix.stream_starts(epoch + 1)[s] if isinstance(old.mix, MixPlan) else (epoch + 1) * size
            if (end - shift) % size == 0:  # the old epoch ends a pass: after the pending items, passes go on
                after_edit[name] = pending % size
            if consumed + pending != size or (start - shift) % size or start < shift:
                continue
            letter = name[0]
            before = [x for x in stream[origin + epoch * old.num_samples : q] if x[0] == letter]
            later = [x for x in stream[q:] if x[0] == letter][:pending]
            if not edit.kept[s] or len(later) < pending:
                continue  # removed, or the run ends before the source has read what it owed
            assert len(before) == consumed
            assert sorted(before + later) == sorted(f"{letter}_{j}" for j in range(size)), (name, edit)
            checked += 1
        new = chain.segments[i + 1]
        shifts = {s.name: after_edit.get(s.name) if s.name in edit.names else 0 for s in new.sources}
    return checked


@pytest.mark.parametrize("trial", range(8))
def test_samples_of_and_consumed_across_random_edits_skips_and_world_sizes(
    files: Path, tmp_path: Path, trial: int
) -> None:
    rng = random.Random(100 + trial)
    mini_epoch = rng.choice([1, 2, 3])
    worlds = [rng.choice([1, 2, 3, 4, 8]) for _ in range(4)]
    t1, t2 = sorted(rng.sample(range(2, 9), 2))
    t3, end = t2 + rng.randint(1, 3), t2 + 7
    mixes = [random_mix(rng, files, REPEATED_RULES, WHOLE_REPEATS)]
    while len(mixes) < 3:
        mixes.append(random_mix(rng, files, REPEATED_RULES, WHOLE_REPEATS))
    # Skipped data batches: one range before the first edit, one given at the second resume (ahead of it).
    a = rng.randrange(0, t1)
    first_skip = [(a, a + rng.randint(1, 2))]
    second_skip = [(t2 + 4, t2 + 6)]
    head, state, _ = run_part(mixes[0], worlds[0], None, t1, mini_epoch, first_skip)
    got = whole(head)
    more, state, _ = run_part(mixes[1], worlds[1], state, t2, mini_epoch, None)
    got += whole(more)
    more, state, _ = run_part(mixes[2], worlds[2], state, t3, mini_epoch, second_skip)
    got += whole(more)
    last, state, samplers = run_part(mixes[2], worlds[3], state, end, mini_epoch, None)  # no edit: goes on
    got += whole(last)
    assert state["skip"] == [list(r) for r in sorted(first_skip + second_skip)]

    path = tmp_path / "run.json"
    manifest = samplers[0].manifest(path)
    assert all(s.manifest() == manifest for s in samplers[1:])  # names no rank
    assert json.loads(path.read_text()) == manifest and len(path.read_text()) < 8000
    plan = RunPlan(path)
    for t in range(end):
        rows = plan.step(t)
        assert [r["line"] for r in rows] == got[t], t
        assert all(r["source"] == f"{r['line'][0]}.txt" and r["file"].endswith(r["source"]) for r in rows)
        if t >= t3:  # what each rank of the last part held
            for r, mine in enumerate(last):
                assert [x["line"] for x in plan.step(t, r, worlds[3])] == mine[t - t3]
    assert [r["line"] for r in samples_of(path, step=end - 1)] == got[end - 1]

    # consumed(): every source's lines counted, the same on every rank; the segments' rows add up.
    counts = [s.consumed(step=end) for s in samplers]
    assert all(c == counts[0] for c in counts)
    seen = Counter(f"{x[0]}.txt" for batch in got for x in batch)
    assert {n: c for n, c in counts[0]["sources"].items() if c} == dict(seen)
    parts = counts[0]["segments"]
    assert [p["batch"] for p in parts] == [0, *(e.step for e in samplers[0].edits)]
    assert [row for p in parts for row in p["epochs"]] == counts[0]["epochs"]

    # The whole stream, skipped batches too (which the sources' queues pass), and the kept sources' epochs.
    stop_batch = samplers[0].skips.batch_of(end)
    stream = [row["line"] for d in range(stop_batch) for row in plan.batch(d)]
    check_kept_epochs(samplers[0], stream)


def test_kept_sources_read_each_sample_once_an_epoch_across_edits(files: Path, tmp_path: Path) -> None:
    """A source read once an epoch, kept across two edits, with a skip just before the first: its epoch in progress
    at the first edit is read whole (at the second, its epoch of the edited mix straddles two of its passes, the
    pending items having ended one), and samples_of names every part's lines."""
    d, b, e = (str(files / f"{x}.txt") for x in "dbe")
    mixes: list[Mix] = [
        ("epochs", [Source(d, repeat=1), Source(b, repeat=1)], None),
        ("epochs", [Source(d, weight=1), Source(e, weight=1)], 40),
        ("plain", [Source(d)], None),
    ]
    per, state, _ = run_part(mixes[0], 2, None, 1, 2, [(1, 2)])
    got = whole(per)
    per, state, _ = run_part(mixes[1], 3, state, 3, 1, None)
    got += whole(per)
    per, state, samplers = run_part(mixes[2], 4, state, 9, 2, None)
    got += whole(per)
    plan = RunPlan(samplers[0].manifest(tmp_path / "run.json"))
    assert [[r["line"] for r in plan.step(t)] for t in range(9)] == got
    stream = [row["line"] for t in range(samplers[0].skips.batch_of(9)) for row in plan.batch(t)]
    assert check_kept_epochs(samplers[0], stream) == 1  # d at the first edit
    edits = samplers[0].edits
    assert [x.step for x in edits] == [2, 4] and edits[0].dropped == {"b.txt": edits[0].pending[1]}


def test_an_earlier_mix_changed_or_unrecorded_is_refused_by_name(files: Path, tmp_path: Path) -> None:
    a, b, c = (str(files / f"{x}.txt") for x in "abc")
    before: Mix = ("epochs", [Source(a), Source(b, ids=np.arange(0, 12, 2))], None)
    after: Mix = ("epochs", [Source(a), Source(c)], None)
    _, state, _ = run_part(before, 1, None, 2, 1, None)
    _, _, samplers = run_part(after, 1, state, 4, 1, None)
    with pytest.raises(ValueError, match=r"source 'b\.txt' of an earlier mix read a listing of its files"):
        samplers[0].manifest(tmp_path / "x.json")
    # Without the listing, the manifest is written; a removed source's file rewritten since is named.
    before = ("epochs", [Source(a), Source(b)], None)
    _, state, _ = run_part(before, 1, None, 2, 1, None)
    _, _, samplers = run_part(after, 1, state, 4, 1, None)
    path = tmp_path / "run.json"
    samplers[0].manifest(path)
    assert json.loads(path.read_text())["rank_dataset_manifest"] == 2
    assert samples_of(path, step=3)
    (files / "b.txt").write_text("".join(f"b_{i}x\n" for i in range(SIZES["b"])))
    from rank_dataset import MetaFileChangedError

    with pytest.raises(MetaFileChangedError, match=r"b\.txt.*source 'b\.txt' \(read from data batch 0\)"):
        samples_of(path, step=0)
    assert samples_of(path, step=3)  # the mix in force from data batch 2 does not read b.txt
    broken = json.loads(path.read_text())
    broken["rank_dataset_manifest"] = 1
    with pytest.raises(ValueError, match="format 2 is that of a run with mixture edits"):
        samples_of(broken, step=3, root=tmp_path)


def test_a_resume_counts_from_the_state_not_from_the_epoch_start(tmp_path: Path) -> None:
    """A state carries the counts of its epoch in progress (a mix by epochs); a resume mid-epoch gives the same
    counts as one that recomputes the epoch's prefix, evaluating only the draws since the state."""
    for name, n in [("web", 900), ("code", 500)]:
        (tmp_path / f"{name}.txt").write_text("".join(f"{name}{i}\n" for i in range(n)))
    sources = [Source(str(tmp_path / "web.txt"), repeat=1), Source(str(tmp_path / "code.txt"), weight=1)]

    def sampler() -> StepSampler:
        ds = RankDataset(sources, reload_cfg={"seed": 1, "epoch_size": 1400}, rank=0, world_size=1)
        return StepSampler(ds, 8)

    first = sampler()
    state = first.state_dict(step=120)  # 960 draws into the epoch of 1,400
    assert state["counted"]["at"] == 960 and sum(state["counted"]["draws"]) == 960
    resumed, fresh = sampler(), sampler()
    resumed.load_state_dict(state)
    fresh.load_state_dict({k: v for k, v in state.items() if k != "counted"})
    for step in (120, 123, 118, 200):
        assert resumed.consumed(step=step) == fresh.consumed(step=step) == first.consumed(step=step)
    counter = resumed._run_counter().counters[0]
    fresh_counter = fresh._run_counter().counters[0]
    # From the anchor: 3 + 5 + 2 batches' draws evaluated (200 is the next epoch's: a closed form and its start).
    assert counter.evaluated <= 10 * 8 + 200 * 8 - 1400
    assert fresh_counter.evaluated >= 400  # the nearest end of the epoch, 440 draws from 960, at least
    with pytest.raises(ValueError, match="counted must be a dict of segment, mix, epoch, at and draws"):
        sampler().load_state_dict({**state, "counted": {"at": 3}})
