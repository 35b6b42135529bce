"""Mixture edits (plan/remix.py) against a slow, obvious reference of the definition, on random mixes and edits."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from rank_dataset import Source
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.remix import MixSegment, RemixChain, SourceEntry
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.steps import stream_samples
from remix_reference import Reference

SIZES = {"a": 7, "b": 12, "c": 5, "d": 20, "e": 9}
SEED = 11

# -- random mixes and edits ---------------------------------------------------------------------------------


def random_rule(rng: random.Random, name: str, by_step: bool, steps: int) -> Source:
    kind = rng.choice(["weight", "repeat", "choose"])
    values = {"weight": [1, 2, 3], "repeat": [0.5, 1, 2], "choose": [3, 6, 15]}[kind]
    if by_step:
        rule: Any = {0: rng.choice(values)}
        if rng.random() < 0.5:
            rule[rng.randrange(1, steps)] = rng.choice(values)
        return Source(f"{name}.txt", name=name, by="step", **{kind: rule})
    return Source(f"{name}.txt", name=name, **{kind: rng.choice(values)})


def random_segment(rng: random.Random, step: int, steps: int) -> MixSegment:
    kind = rng.choice(["plain", "epochs", "epochs", "steps"])
    if kind == "plain":
        name = rng.choice(sorted(SIZES))
        return MixSegment(step, "plain", (SourceEntry(name, SIZES[name], f"fp-{name}"),), SIZES[name])
    names = rng.sample(sorted(SIZES), rng.randint(1, 3))
    sources = [random_rule(rng, n, kind == "steps", steps) for n in names]
    sizes = [SIZES[n] for n in names]
    entries = tuple(SourceEntry(n, SIZES[n], f"fp-{n}") for n in names)
    if kind == "epochs":
        weighted = any(s.kind == "weight" for s in sources)  # then an epoch size that leaves them something
        plan = MixPlan.from_sources(sizes, sources, rng.choice([40, 60]) if weighted else None)
        return MixSegment(step, "epochs", entries, plan.epoch_size, plan)
    mix = StepMix.from_sources(sizes, sources, rng.choice([100, 120]))
    assert mix is not None
    return MixSegment(step, "steps", entries, mix.epoch_size, mix)


def random_chain(rng: random.Random, steps: int) -> tuple[list[MixSegment], BatchSchedule]:
    schedule = BatchSchedule.of(rng.choice([4, {0: 3, 5: 6}, 8]))
    edits = sorted(rng.sample(range(1, steps - 2), rng.randint(1, 3)))
    return [random_segment(rng, t, steps) for t in [0, *edits]], schedule


@pytest.mark.parametrize("trial", range(40))
def test_random_edits_equal_the_definition(trial: int) -> None:
    rng = random.Random(trial)
    steps = 24
    segments, schedule = random_chain(rng, steps)
    chain = RemixChain(segments, seed=SEED, aug_repeats=1, schedule=schedule)
    reference = Reference(segments, schedule, SEED)
    draws = np.arange(schedule.start(steps), dtype=np.int64)
    seg, src, local = chain.locate(draws)
    got = [(segments[g].sources[s].name, int(x)) for g, s, x in zip(seg.tolist(), src.tolist(), local.tolist())]
    assert got == [reference.item(q) for q in draws.tolist()]
    # The removed sources' dropped counts and every source's pending items are the reference's.
    for edit, pending, new in zip(chain.edits, reference.pending, segments[1:]):
        assert dict(zip(edit.names, edit.pending)) == pending
        kept = {s.name for s in new.sources}
        assert edit.dropped == {n: p for n, p in zip(edit.names, edit.pending) if n not in kept}


def test_the_first_segment_is_the_unedited_stream() -> None:
    """Without an edit, the chain's samples are the StepSampler's stream of the mix (plain, by epochs, by steps)."""
    schedule = BatchSchedule.of({0: 4, 3: 8})
    draws = np.arange(200, dtype=np.int64)
    plain = MixSegment(0, "plain", (SourceEntry("d", 20, None),), 20)
    assert (
        RemixChain([plain], seed=SEED, aug_repeats=1, schedule=schedule).samples(draws)
        == stream_samples(draws, 20, SEED)
    ).all()
    sources = [Source("a.txt", name="a", weight=2), Source("b.txt", name="b", repeat={0: 1, 3: 2})]
    plan = MixPlan.from_sources([7, 12], sources, 40)
    entries = (SourceEntry("a", 7, None), SourceEntry("b", 12, None))
    epochs = MixSegment(0, "epochs", entries, plan.epoch_size, plan)
    got = RemixChain([epochs], seed=SEED, aug_repeats=1, schedule=schedule).samples(draws)
    assert (got == stream_samples(draws, plan.epoch_size, SEED, 1, plan)).all()
    by_step = [Source("a.txt", name="a", weight={0: 1, 6: 4}, by="step"), Source("b.txt", name="b", choose=5)]
    mix = StepMix.from_sources([7, 12], by_step, 20)
    assert mix is not None
    steps = MixSegment(0, "steps", entries, 20, mix)
    got = RemixChain([steps], seed=SEED, aug_repeats=1, schedule=schedule).samples(draws)
    assert (got == mix.samples(draws, schedule, SEED)).all()


@pytest.mark.parametrize("trial", range(30))
def test_a_kept_source_repeats_and_skips_nothing_of_its_epoch(trial: int) -> None:
    """A source read once an epoch (repeat=1): the epoch in progress at the edit, read before it and after it,
    is every sample once; with any rule, it is the multiset the unedited run's epoch held."""
    rng = random.Random(1000 + trial)
    schedule = BatchSchedule.of(rng.choice([3, 4, 5]))
    once = Source("a.txt", name="a", repeat=1)
    others = [random_rule(rng, n, False, 10) for n in rng.sample(["b", "c", "d"], rng.randint(0, 2))]
    sources = [once, *others]
    weighted = any(s.kind == "weight" for s in sources)
    plan = MixPlan.from_sources([SIZES[s.name] for s in sources], sources, 60 if weighted else None)
    entries = tuple(SourceEntry(s.name, SIZES[s.name], None) for s in sources)
    old = MixSegment(0, "epochs", entries, plan.epoch_size, plan)
    edit = rng.randrange(1, 3 * plan.epoch_size // schedule.size(0))
    new = random_segment(rng, edit, 30)
    if "a" not in {s.name for s in new.sources}:  # keep "a" in the new mix
        new = MixSegment(edit, "plain", (SourceEntry("a", 7, None),), 7)
    chain = RemixChain([old, new], seed=SEED, aug_repeats=1, schedule=schedule)
    q = schedule.start(edit)
    epoch = q // plan.epoch_size
    start = epoch * plan.epoch_size
    _, src_old, before = RemixChain([old], seed=SEED, aug_repeats=1, schedule=schedule).locate(np.arange(start, q))
    names = [s.name for s in sources]
    read_before = [int(x) for s, x in zip(src_old.tolist(), before.tolist()) if names[s] == "a"]
    pending = chain.edits[0].pending[0]
    assert chain.edits[0].consumed[0] == len(read_before)
    _, src, after = chain.locate(np.arange(q, q + 40 * plan.epoch_size))
    read_after = [int(x) for s, x in zip(src.tolist(), after.tolist()) if new.sources[s].name == "a"][:pending]
    assert len(read_after) == pending
    assert sorted(read_before + read_after) == list(range(7))  # every sample of "a" once: none twice, none skipped


def test_chained_edits_and_a_re_edit_at_the_same_step() -> None:
    schedule = BatchSchedule.of(4)
    a, b, c = (SourceEntry(n, SIZES[n], None) for n in "abc")
    one = MixSegment(0, "epochs", (a, b), 19, MixPlan((7, 12), (7, 12), 19))
    two = MixSegment(3, "epochs", (b, c), 17, MixPlan((12, 5), (12, 5), 17))
    three = MixSegment(7, "epochs", (a, c), 12, MixPlan((7, 5), (7, 5), 12))
    chain = RemixChain([one], seed=SEED, aug_repeats=1, schedule=schedule).then(two).then(three)
    assert [s.step for s in chain.segments] == [0, 3, 7]
    assert chain.edits[0].dropped == {"a": chain.edits[0].pending[0]} and chain.edits[1].dropped == {
        "b": chain.edits[1].pending[0]
    }
    reference = Reference([one, two, three], schedule, SEED)
    seg, src, local = chain.locate(np.arange(120))
    segs = chain.segments
    assert [(segs[g].sources[s].name, int(x)) for g, s, x in zip(seg.tolist(), src.tolist(), local.tolist())] == [
        reference.item(q) for q in range(120)
    ]
    # An edit at the step of the last one replaces it (nothing was read under it).
    again = chain.then(MixSegment(7, "plain", (c,), 5))
    assert [s.step for s in again.segments] == [0, 3, 7] and again.last.kind == "plain"
    with pytest.raises(ValueError, match="precedes the run's last edit"):
        chain.then(MixSegment(5, "plain", (c,), 5))
    # The chain as a state and back: the same samples.
    back = RemixChain.from_state(chain.to_state())
    assert back == chain and (back.samples(np.arange(120)) == chain.samples(np.arange(120))).all()


def test_an_edit_that_cannot_be_honoured_names_the_source() -> None:
    schedule = BatchSchedule.of(4)
    one = MixSegment(0, "plain", (SourceEntry("a", 7, "x"),), 7)
    with pytest.raises(ValueError, match="source 'a' has fingerprint y, x before the edit"):
        RemixChain([one], seed=SEED, aug_repeats=1, schedule=schedule).then(
            MixSegment(2, "plain", (SourceEntry("a", 7, "y"),), 7)
        )
    with pytest.raises(ValueError, match="source 'a' has 8 samples, 7 before the edit"):
        RemixChain([one], seed=SEED, aug_repeats=1, schedule=schedule).then(
            MixSegment(2, "plain", (SourceEntry("a", 8, "x"),), 8)
        )
    with pytest.raises(ValueError, match="two sources are named 'a'"):
        MixSegment(0, "epochs", (SourceEntry("a", 7, None),) * 2, 14, MixPlan((7, 7), (7, 7), 14))


def test_aug_repeats_keeps_every_copy_together() -> None:
    """With aug_repeats=2 a draw is two items: the pending draws of a kept source are read first, once each."""
    schedule = BatchSchedule.of(4)  # in items: 2 draws a batch
    a, b = SourceEntry("a", 7, None), SourceEntry("b", 12, None)
    one = MixSegment(0, "plain", (a,), 7)
    two = MixSegment(3, "epochs", (a, b), 19, MixPlan((7, 12), (7, 12), 19))
    chain = RemixChain([one, two], seed=SEED, aug_repeats=2, schedule=schedule)
    q = schedule.start(3) // 2  # 6 draws, of D = 4 a plain epoch: epoch 1's draws 4, 5 read, 6 pending
    assert (chain.edits[0].epoch, chain.edits[0].consumed, chain.edits[0].pending) == ((1,), (2,), (2,))
    _, src, local = chain.locate(np.arange(q, q + 40))
    first_a = [int(x) for s, x in zip(src.tolist(), local.tolist()) if s == 0][:2]
    assert first_a == stream_samples(np.arange(6, 8), 7, SEED, 2).tolist()
    counts = Counter(int(x) for x in stream_samples(np.arange(4, 8), 7, SEED, 2).tolist())
    assert max(counts.values()) == 1  # the plain epoch's four draws: four distinct samples


def test_a_shard_spec_read_back_from_its_dict_holds_the_same_samples() -> None:
    """What a DataLoader worker reads: the spec of a window after an edit, as JSON and back, gives the same
    indices as the rank's (the worker builds the chain from the dict)."""
    import json

    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.plan.steps import StepLayout

    schedule = BatchSchedule.of(4)
    a, b, c = (SourceEntry(n, SIZES[n], None) for n in "abc")
    new_plan = MixPlan((12, 5), (12, 5), 17)
    chain = RemixChain(
        [
            MixSegment(0, "epochs", (a, b), 19, MixPlan((7, 12), (7, 12), 19)),
            MixSegment(3, "epochs", (b, c), 17, new_plan),
        ],
        seed=SEED,
        aug_repeats=1,
        schedule=schedule,
    )
    layout = StepLayout(schedule, remix=chain)
    for epoch in range(3):
        spec = ShardSpec(
            17, world_size=2, rank=1, mini_epoch=2, mini_epoch_idx=1, seed=SEED, epoch=epoch, mix=new_plan, steps=layout
        )
        back = ShardSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
        assert back == spec
        assert (
            back.indices().tolist() == spec.indices().tolist() == chain.samples(epoch * 17 + spec.positions()).tolist()
        )
