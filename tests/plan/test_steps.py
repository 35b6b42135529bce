"""The step stream's arithmetic (rank_dataset.plan.steps, plan.step_state, ShardSpec.steps): pure, no torch."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest

from rank_dataset.plan.counts import batch_counts
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.step_state import StepState, find_step_state
from rank_dataset.plan.steps import StepLayout, draws_per_epoch, stream_samples

SEED = 7


def rank_batches(
    n: int,
    world: int,
    mini: int,
    schedule: BatchSchedule,
    steps: int,
    k: int = 1,
    mix: MixPlan | None = None,
    draws: bool = False,
    step_mix: StepMix | None = None,
) -> dict[int, list[list[int]]]:
    """Each step's batch on each rank, read from the shards of the windows in order (as a StepSampler does);
    ``draws``: the stream's draw numbers in place of the samples."""
    layout = StepLayout(schedule, step_mix)
    out: dict[int, list[list[int]]] = {}
    epoch = 0
    while len(out) < steps:
        for m in range(mini):
            first, stop = layout.steps_of(n, mini, epoch, m, k)
            for r in range(world):
                spec = ShardSpec(
                    n,
                    world,
                    r,
                    mini_epoch=mini,
                    mini_epoch_idx=m,
                    seed=SEED,
                    epoch=epoch,
                    mix=mix,
                    aug_repeats=k,
                    steps=layout,
                )
                if draws:
                    items = (spec.positions() // k + epoch * draws_per_epoch(n, k)).tolist()
                else:
                    items = spec.indices().tolist()
                at = 0
                for t in range(first, stop):
                    block = schedule.size(t) // world
                    out.setdefault(t, [[] for _ in range(world)])[r] = items[at : at + block]
                    at += block
                assert at == len(items)
        epoch += 1
    return out


def global_batches(batches: dict[int, list[list[int]]], steps: int) -> list[list[int]]:
    return [[x for block in batches[t] for x in block] for t in range(steps)]


SCHEDULES = [{0: 8}, {0: 8, 3: 16, 7: 24}, {0: 24, 2: 8}, {0: 64}]


@pytest.mark.parametrize("n", [1, 7, 10, 33, 100])
@pytest.mark.parametrize("mini", [1, 3, 8])
@pytest.mark.parametrize("sizes", SCHEDULES, ids=lambda s: "-".join(map(str, s.values())))
def test_global_batch_is_the_same_on_any_world_size(n: int, mini: int, sizes: dict[int, int]) -> None:
    schedule = BatchSchedule.of(sizes)
    steps = 15
    reference = global_batches(rank_batches(n, 1, mini, schedule, steps), steps)
    # The stream: global batch t is the items [S(t), S(t+1)) of the epochs' orders back to back.
    for t in range(steps):
        expected = stream_samples(np.arange(schedule.start(t), schedule.start(t + 1)), n, SEED)
        assert reference[t] == expected.tolist()
    for world in (2, 4, 8):
        batches = rank_batches(n, world, mini, schedule, steps)
        assert global_batches(batches, steps) == reference, world
        assert all(len(b) == schedule.size(t) // world for t in range(steps) for b in batches[t])


@pytest.mark.parametrize("n", [5, 10, 64, 101])
def test_each_sample_once_an_epoch(n: int) -> None:
    for e in range(3):
        epoch = stream_samples(np.arange(e * n, (e + 1) * n), n, SEED)
        assert sorted(epoch.tolist()) == list(range(n))
    # A batch straddles the epoch's end: its head is the end of epoch 0, its tail the start of epoch 1.
    schedule = BatchSchedule.of(n - 1 if n > 1 else 1)
    batches = global_batches(rank_batches(n, 1, 2, schedule, 4), 4)
    flat = [x for b in batches for x in b]
    assert sorted(flat[:n]) == list(range(n))


def test_random_schedules_property() -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        world = int(rng.choice([1, 2, 4, 8]))
        n, mini = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        changes = sorted({0, *rng.integers(1, 30, int(rng.integers(0, 4))).tolist()})
        sizes = {s: 8 * int(rng.integers(1, 6)) for s in changes}
        schedule = BatchSchedule.of(sizes)
        steps = int(rng.integers(1, 40))
        ref = global_batches(rank_batches(n, 1, mini, schedule, steps), steps)
        assert global_batches(rank_batches(n, world, mini, schedule, steps), steps) == ref
        for t in range(steps + 5):
            assert schedule.step_at(schedule.start(t)) == t
            assert schedule.step_at(schedule.start(t) + 1) == t + 1
            assert schedule.start(t + 1) - schedule.start(t) == schedule.size(t)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("n", [9, 24, 50])
def test_aug_repeats_copies_on_different_ranks(k: int, n: int) -> None:
    schedule = BatchSchedule.of({0: 24, 4: 48})
    steps = 12
    ref = global_batches(rank_batches(n, 1, 2, schedule, steps, k=k), steps)
    for world in (2, 4, 8):
        if any(size % world for _, size in schedule.changes):
            continue
        assert global_batches(rank_batches(n, world, 2, schedule, steps, k=k), steps) == ref
        batches = rank_batches(n, world, 2, schedule, steps, k=k, draws=True)
        for t in range(steps):
            owner: dict[int, list[int]] = {}
            size = schedule.size(t)
            for r, block in enumerate(batches[t]):
                for x in block:
                    owner.setdefault(x, []).append(r)
            assert all(len(ranks) == k for ranks in owner.values()) and len(owner) == size // k
            if world >= k:  # every copy of a draw on a rank of its own
                assert all(len(set(ranks)) == len(ranks) for ranks in owner.values())
    # k consecutive epochs draw every sample once, each drawn k times.
    draws = draws_per_epoch(n, k)
    samples = stream_samples(np.arange(k * draws), n, SEED, k).tolist()
    assert Counter(samples[:n]) == Counter(range(n)) or draws * k > n


def test_mix_by_steps() -> None:
    plan = MixPlan((10, 7, 3), (6, 8, 6), 20)
    schedule = BatchSchedule.of({0: 4, 5: 8})
    ref = global_batches(rank_batches(20, 1, 3, schedule, 12, mix=plan), 12)
    assert global_batches(rank_batches(20, 4, 3, schedule, 12, mix=plan), 12) == ref
    flat = [x for b in ref for x in b][:20]
    per_source = Counter(int(s) for s in plan.source_of(np.array(flat)))
    assert [per_source[s] for s in range(3)] == [6, 8, 6]  # epoch 0 takes c_s of each source


@pytest.mark.parametrize("k", [2, 3])
def test_mix_by_epochs_with_aug_repeats(k: int) -> None:
    plan = MixPlan((10, 7, 3), (6, 8, 6), 20, ((2, (10, 4, 6)),))  # a schedule by epoch too
    schedule = BatchSchedule.of({0: 4 * k, 5: 8 * k})
    steps = 16
    ref = global_batches(rank_batches(20, 1, 3, schedule, steps, k=k, mix=plan), steps)
    for world in (2, 4):
        assert global_batches(rank_batches(20, world, 3, schedule, steps, k=k, mix=plan), steps) == ref, world
    assert all(b == b[: len(b) // k] * k for b in ref)  # copy-major: the k copies of each draw B/k apart
    draws = np.array([x for b in ref for x in b[: len(b) // k]])
    per_epoch = draws_per_epoch(20, k)
    for epoch in range(3):  # each epoch's draws: its order's, each source its draws of the epoch
        got = draws[epoch * per_epoch : (epoch + 1) * per_epoch]
        assert got.tolist() == plan.epoch_order(SEED, epoch, np.arange(per_epoch) * k, k).tolist()
        assert np.bincount(plan.source_of(got), minlength=3).tolist() == list(plan.draws(k, epoch))


def test_window_memory_bound() -> None:
    # A rank's shard: its share of one window plus one global batch.
    for n, mini, world in [(100, 3, 4), (1000, 7, 8), (50, 1, 2)]:
        schedule = BatchSchedule.of({0: 8, 10: 40})
        layout = StepLayout(schedule)
        width = -(-n // mini)
        for e in range(3):
            for m in range(mini):
                spec = ShardSpec(n, world, 1, mini_epoch=mini, mini_epoch_idx=m, seed=1, epoch=e, steps=layout)
                assert spec.positions().size <= -(-width // world) + 40 // world


def test_schedule_validation() -> None:
    assert BatchSchedule.of(256).changes == ((0, 256),)
    assert BatchSchedule.of({"0": 8, "5": 16}) == BatchSchedule.of({5: 16, 0: 8})
    with pytest.raises(ValueError, match="must hold step 0"):
        BatchSchedule.of({3: 8})
    with pytest.raises(ValueError, match="must hold step 0"):
        BatchSchedule.of({})
    with pytest.raises(ValueError, match="global_batch_size must be >= 1"):
        BatchSchedule.of(0)
    with pytest.raises(TypeError, match="global_batch_size"):
        BatchSchedule.of(8.0)
    with pytest.raises(ValueError, match="global_batch_size 12 at step 4 is not a multiple of the world size 8"):
        BatchSchedule.of({0: 16, 4: 12}).check(8)
    with pytest.raises(ValueError, match="at step 0 is not a multiple of aug_repeats=3"):
        BatchSchedule.of(8).check(2, 3)
    with pytest.raises(ValueError, match="not a multiple of the world size 4"):
        ShardSpec(10, 4, 0, steps=StepLayout(BatchSchedule.of(6)))
    with pytest.raises(ValueError, match="training layout"):
        ShardSpec(10, 2, 0, is_test=True, steps=StepLayout(BatchSchedule.of(6)))


def test_spec_round_trip_and_plain_dict_unchanged() -> None:
    layout = StepLayout(BatchSchedule.of({0: 8, 3: 16}))
    spec = ShardSpec(50, 4, 2, mini_epoch=3, mini_epoch_idx=1, seed=3, epoch=2, steps=layout)
    d = json.loads(json.dumps(spec.to_dict()))
    assert ShardSpec.from_dict(d) == spec
    assert "steps" not in ShardSpec(50, 4, 2).to_dict()  # a plain spec's dict is as before
    with pytest.raises(ValueError, match="resumes by step"):
        spec.consumed_positions(1)


def test_step_state() -> None:
    schedule = BatchSchedule.of({0: 256, 1000: 1024})
    state = StepState(12345, 10**9, "f" * 64, 3, 1, schedule, "a" * 16)
    d = state.to_dict()
    assert len(json.dumps(d)) < 1024
    assert StepState.from_dict(json.loads(json.dumps(d))) == state
    assert find_step_state({"a": {"b": d}, "c": 1}) == d
    assert find_step_state({"a": 1}) is None
    for change, what in [
        ({"seed": 4}, "seed"),
        ({"num_samples": 10}, "number of samples"),
        ({"fingerprint": "g"}, "files"),
        ({"mix": None}, "mix"),
        ({"aug_repeats": 2}, "aug_repeats"),
        ({"schedule": BatchSchedule.of(256)}, "schedule"),
    ]:
        other = StepState(**{**state.__dict__, **change})
        with pytest.raises(ValueError, match=what):
            state.check_same_stream(other)
    with pytest.raises(ValueError, match="not a StepSampler state"):
        StepState.from_dict({"step": 1})
    with pytest.raises(ValueError, match="missing seed"):
        StepState.from_dict({"rank_dataset_steps": 1, "step": 1, "global_batch_size": {"0": 8}, "num_samples": 3})
    with pytest.raises(ValueError, match=r"step must be in \[0, "):
        StepState.from_dict({**d, "step": -1})


def test_batch_counts_largest_remainder() -> None:
    assert batch_counts(8, [1, 1, 1]) == [3, 3, 2]  # equal remainders favour the earlier source
    assert batch_counts(16, [3, 1, 0.5]) == [11, 3, 2]
    assert batch_counts(4, [1, 1000]) == [0, 4]
    rng = np.random.default_rng(3)
    for _ in range(200):
        weights = rng.random(int(rng.integers(1, 6))) + 0.01
        size = int(rng.integers(1, 300))
        counts = batch_counts(size, weights.tolist())
        assert sum(counts) == size
        quotas = size * weights / weights.sum()
        assert all(abs(c - q) < 1 for c, q in zip(counts, quotas))


def test_weights_by_step() -> None:
    sizes = (50, 30, 7)
    plan = MixPlan(sizes, (40, 30, 10), 80)  # the mix's epoch size cuts the windows only
    step_mix = StepMix.of(sizes, 80, ["weight"] * 3, [{0: 1, 5: 3}, 1, {0: 1, 8: 0.5}])
    schedule = BatchSchedule.of({0: 8, 6: 16})
    steps = 40
    ref = global_batches(rank_batches(80, 1, 3, schedule, steps, mix=plan, step_mix=step_mix), steps)
    for world in (2, 4, 8):
        got = rank_batches(80, world, 3, schedule, steps, mix=plan, step_mix=step_mix)
        assert global_batches(got, steps) == ref, world
    offsets = np.cumsum((0, *sizes))
    taken = np.zeros(offsets[-1], np.int64)
    for t, batch in enumerate(ref):
        source = np.searchsorted(offsets, batch, side="right") - 1
        weights = [3 if t >= 5 else 1, 1, 0.5 if t >= 8 else 1]
        # The change lands exactly at step 5 (and 8): the counts of each batch are its weights' apportionment.
        assert np.bincount(source, minlength=3).tolist() == batch_counts(schedule.size(t), weights), t
        np.add.at(taken, batch, 1)
        for s in range(len(sizes)):  # each source's stream: every sample once before any twice
            mine = taken[offsets[s] : offsets[s + 1]]
            assert mine.max() - mine.min() <= 1, (t, s)


def expected_shares(sizes: Sequence[int], sources: Sequence[Source], epoch_size: int, step: int) -> list[Fraction]:
    """The test's own reading of the rules by step: fixed counts, then the weights' exact share of what is left."""
    shares: list[Fraction] = []
    for n, source in zip(sizes, sources):
        rule = source.step_rule if source.step_rule is not None else {0: getattr(source, source.kind)}
        value = rule[max(s for s in rule if s <= step)]
        shares.append(Fraction(round(value * n)) if source.kind == "repeat" else Fraction(value))
    weighted = [s for s, source in enumerate(sources) if source.kind == "weight"]
    left = epoch_size - sum(c for s, c in enumerate(shares) if s not in weighted)
    whole = sum(shares[s] for s in weighted)
    return [left * c / whole if s in weighted else c for s, c in enumerate(shares)]


def random_source(rng: np.random.Generator, s: int) -> Source:
    kind = str(rng.choice(["weight", "repeat", "choose"]))
    steps = sorted({0, *rng.integers(1, 25, int(rng.integers(0, 3))).tolist()})
    draw = {
        "weight": lambda: float(rng.choice([0.5, 1, 2, 3, 0.3])),
        "repeat": lambda: float(rng.choice([0.5, 1, 1.5, 2])),
        "choose": lambda: int(rng.integers(1, 40)),
    }[kind]
    rule = {t: draw() for t in steps}
    if rng.random() < 0.3:  # a fixed rule beside the others' schedules
        return Source(f"s{s}.txt", **{kind: rule[0]})
    return Source(f"s{s}.txt", **{kind: rule}, by="step")


def test_rules_by_step_property() -> None:
    """Weights, repeats and chooses by step, with and without aug_repeats: each global batch's counts are exact
    (its draws apportioned by the rules in force at that step), the same global batches on 1, 2 and 4 ranks,
    the k copies of a draw in the batch on k different ranks, each source's stream once before twice."""
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 30:
        sizes = [int(rng.integers(1, 60)) for _ in range(int(rng.integers(1, 5)))]
        sources = [random_source(rng, s) for s in range(len(sizes))]
        if all(s.step_rule is None for s in sources):
            continue
        k = int(rng.choice([1, 1, 2, 3]))
        try:
            plan = MixPlan.from_sources(sizes, sources, None if rng.random() < 0.5 else int(rng.integers(60, 200)))
            step_mix = StepMix.from_sources(sizes, sources, plan.epoch_size)
            plan.check_draws(k)
        except ValueError:  # rules that cannot be met (fixed counts over the epoch size): refused, named
            continue
        assert step_mix is not None
        t0 = plan.epoch_size
        schedule = BatchSchedule.of({s: 4 * k * int(rng.integers(1, 5)) for s in sorted({0, int(rng.integers(1, 20))})})
        steps = int(rng.integers(10, 30))
        mini = int(rng.integers(1, 4))
        ref = global_batches(rank_batches(t0, 1, mini, schedule, steps, k=k, mix=plan, step_mix=step_mix), steps)
        for world in (2, 4):
            got = rank_batches(t0, world, mini, schedule, steps, k=k, mix=plan, step_mix=step_mix)
            assert global_batches(got, steps) == ref, (sizes, sources, world)
            if k > 1:
                where = rank_batches(t0, world, mini, schedule, steps, k=k, draws=True)
                for t in range(steps):
                    per = schedule.size(t) // k
                    flat = [(x, r) for r, block in enumerate(where[t]) for x in block]
                    for i in range(per):  # copy c of draw i is item i + c * per: the same draw, another rank
                        copies = [flat[i + c * per] for c in range(k)]
                        assert len({x for x, _ in copies}) == 1
                        assert len({r for _, r in copies}) == min(k, world)
        offsets = np.cumsum((0, *sizes))
        taken = np.zeros(offsets[-1], np.int64)
        for t, batch in enumerate(ref):
            per = schedule.size(t) // k
            assert all(batch[i] == batch[i % per] for i in range(len(batch)))  # copy-major: k copies of each draw
            draws = np.array(batch[:per])
            source = np.searchsorted(offsets, draws, side="right") - 1
            want = batch_counts(per, expected_shares(sizes, sources, t0, t))
            assert np.bincount(source, minlength=len(sizes)).tolist() == want, (t, sources)
            np.add.at(taken, draws, 1)
            for s in range(len(sizes)):
                mine = taken[offsets[s] : offsets[s + 1]]
                assert mine.max() - mine.min() <= 1, (t, s)
        checked += 1


def test_repeat_and_choose_by_step_land_at_the_step() -> None:
    sizes = (50, 30, 7)
    sources = [
        Source("a.txt", repeat={0: 1, 5: 2}, by="step"),
        Source("b.txt", weight=1),
        Source("c.txt", choose={0: 5, 8: 20}, by="step"),
    ]
    plan = MixPlan.from_sources(sizes, sources, 150)
    assert plan.counts == (50, 95, 5)  # an epoch-by-epoch reading: the rules at step 0
    step_mix = StepMix.from_sources(sizes, sources, 150)
    assert step_mix is not None
    assert (
        step_mix.shares(4) == (50, 95, 5) and step_mix.shares(5) == (100, 45, 5) and step_mix.shares(8) == (100, 30, 20)
    )
    schedule = BatchSchedule.of(30)
    ref = global_batches(rank_batches(150, 1, 2, schedule, 10, mix=plan, step_mix=step_mix), 10)
    counts = [np.bincount(plan.source_of(np.array(b)), minlength=3).tolist() for b in ref]
    assert counts[4] == [10, 19, 1] and counts[5] == [20, 9, 1] and counts[7] == counts[5] and counts[8] == [20, 6, 4]
    state = StepMix.from_dict(json.loads(json.dumps(step_mix.to_dict())))
    assert state == step_mix
    with pytest.raises(ValueError, match=r"source 'a\.txt': repeat=0\.001 of its 50 samples rounds to 0 .* step 3"):
        StepMix.from_sources(sizes, [Source("a.txt", repeat={0: 1, 3: 0.001}, by="step"), *sources[1:]], 150)
    with pytest.raises(ValueError, match=r"from step 5 the fixed .* add up to 155, leaving nothing .* 'b\.txt'"):
        StepMix.from_sources(sizes, [Source("a.txt", repeat={0: 1, 5: 3}, by="step"), *sources[1:]], 150)
    with pytest.raises(ValueError, match=r"source 'b\.txt' has a schedule by epoch"):
        StepMix.from_sources(sizes, [sources[0], Source("b.txt", weight={0: 1, 2: 3}), sources[2]], 150)
    assert StepMix.from_sources(sizes, [Source("a.txt"), Source("b.txt", weight={0: 1, 2: 3})], 150) is None


def test_step_mix_samples_are_the_definition() -> None:
    """StepMix.samples (every step's slot shuffle at once) against the definition written step by step: batch t's
    slots shuffled by permute(B, slot key, t, .), slot j of source s its next draw of the source's stream."""
    from rank_dataset.plan.mix import source_seed
    from rank_dataset.plan.permutation import permute, permute_stream
    from rank_dataset.plan.step_mix import _SLOT_KEY

    rng = np.random.default_rng(5)
    for _ in range(20):
        sizes = [int(rng.integers(1, 90)) for _ in range(int(rng.integers(1, 4)))]
        rules = [{0: float(rng.integers(1, 4)), int(rng.integers(1, 12)): float(rng.integers(1, 4))} for _ in sizes]
        mix = StepMix.of(sizes, 100, ["weight"] * len(sizes), rules)
        schedule = BatchSchedule.of({0: int(rng.integers(1, 20)), int(rng.integers(1, 9)): int(rng.integers(1, 30))})
        seed = int(rng.integers(0, 2**40))
        steps = 25
        expected, taken = [], [0] * len(sizes)
        offsets = np.cumsum((0, *sizes))
        for t in range(steps):
            size = schedule.size(t)
            counts = batch_counts(size, mix.shares(t))
            ends = np.cumsum(counts)
            for slot in permute(size, (seed * 0x9E3779B1 + _SLOT_KEY) & ((1 << 63) - 1), t, np.arange(size)).tolist():
                s = int(np.searchsorted(ends, slot, side="right"))
                position = taken[s] + slot - (int(ends[s]) - counts[s])
                expected.append(int(permute_stream(sizes[s], source_seed(seed, s), position, [0])[0]) + offsets[s])
            taken = [a + c for a, c in zip(taken, counts)]
        items = np.arange(schedule.start(steps))
        assert mix.samples(items, schedule, seed).tolist() == expected
        order = rng.permutation(items.size)  # any order of items, any subset
        assert mix.samples(items[order][:50], schedule, seed).tolist() == [expected[i] for i in order[:50]]
