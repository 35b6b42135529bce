"""Per-source accounting (rank_dataset.plan.consumed) against a brute-force count of the plan's global batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rank_dataset.plan.consumed import SourceCounter
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.shapes import ShapeLayout, ShapeStream
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.steps import StepLayout, draws_per_epoch

SEED = 5


def brute_force(
    n: int, world: int, mini: int, layout: StepLayout, stop: int, k: int, mix: MixPlan | None, sources: int
) -> np.ndarray:
    """Items of each source, per epoch, in global batches ``[0, stop)``: every rank's shard of every window read
    in order as a StepSampler reads it, each item's sample mapped to its source and its draw to its epoch."""
    counts: dict[int, np.ndarray] = {}
    per = draws_per_epoch(n, k)
    offsets = np.cumsum((0, *(mix.sizes if mix is not None else (n,))))
    epoch, seen = 0, 0
    while seen < stop:
        for m in range(mini):
            first, end = layout.steps_of(n, mini, epoch, m, k)
            for r in range(world):
                spec = ShardSpec(
                    n, world, r, mini_epoch=mini, mini_epoch_idx=m, seed=SEED, epoch=epoch, mix=mix,
                    aug_repeats=k, steps=layout,
                )  # fmt: skip
                samples, draws = spec.indices(), spec.positions() // k + epoch * per
                at = 0
                for t in range(first, end):
                    block = layout.schedule.size(t) // world
                    if t < stop:
                        source = np.searchsorted(offsets, samples[at : at + block], side="right") - 1
                        epochs = draws[at : at + block] // per
                        for e in np.unique(epochs).tolist():  # each item counted once, by its epoch and source
                            row = counts.setdefault(e, np.zeros(sources, np.int64))
                            row += np.bincount(source[epochs == e], minlength=sources)
                    at += block
            seen = max(seen, end)
        epoch += 1
    rows = max(counts) + 1 if counts else 0
    return np.array([counts.get(e, np.zeros(sources, np.int64)) for e in range(rows)], np.int64).reshape(rows, sources)


def _random_rule(rng: np.random.Generator, kind: str, by_step: bool) -> Any:
    draw = {
        "weight": lambda: float(rng.choice([0.5, 1, 2, 3])),
        "repeat": lambda: float(rng.choice([0.5, 1, 2])),
        "choose": lambda: int(rng.integers(2, 30)),
    }[kind]
    if rng.random() < 0.4:
        return draw()
    when = sorted({0, *(int(x) for x in rng.integers(1, 12 if by_step else 4, size=2))})
    return {t: draw() for t in when}


def test_counts_equal_the_brute_force_over_random_mixes_schedules_and_world_sizes() -> None:
    rng = np.random.default_rng(3)
    checked = {"plain": 0, "epochs": 0, "steps": 0}
    while min(checked.values()) < 8:
        kind = ["plain", "epochs", "steps"][int(rng.integers(3))]
        if checked[kind] >= 8:
            continue
        k = int(rng.choice([1, 1, 2, 3]))
        world = int(rng.choice([1, 2, 4]))
        schedule = BatchSchedule.of(
            {s: 4 * k * int(rng.integers(1, 4)) for s in sorted({0, *(int(x) for x in rng.integers(1, 15, size=2))})}
        )
        mix = step_mix = None
        try:
            if kind == "plain":
                n = int(rng.integers(1, 90))
            else:
                sizes = [int(rng.integers(1, 50)) for _ in range(int(rng.integers(1, 5)))]
                by_step = kind == "steps"
                srcs = []
                for s in range(len(sizes)):
                    rule_kind = str(rng.choice(["weight", "repeat", "choose"]))
                    rule = _random_rule(rng, rule_kind, by_step)
                    extra = {"by": "step"} if by_step and isinstance(rule, dict) else {}
                    srcs.append(Source(f"s{s}.txt", **{rule_kind: rule}, **extra))
                mix = MixPlan.from_sources(sizes, srcs, None if rng.random() < 0.5 else int(rng.integers(40, 160)))
                mix.check_draws(k)
                if by_step:
                    step_mix = StepMix.from_sources(sizes, srcs, mix.epoch_size)
                    if step_mix is None:
                        continue
                n = mix.epoch_size
        except ValueError:  # rules that cannot be met: refused by the plan, not this test's business
            continue
        layout = StepLayout(schedule, step_mix)
        sources = 1 if mix is None else len(mix.sizes)
        counter = SourceCounter(layout, n, SEED, k, mix)
        stops = sorted(int(x) for x in rng.integers(0, 40, size=3))
        want_all = brute_force(n, world, int(rng.integers(1, 4)), layout, stops[-1], k, mix, sources)
        for stop in stops:  # increasing: the kept prefix of the epoch in progress is used, then checked afresh
            got = counter.per_epoch(stop)
            want = brute_force(n, world, 1, layout, stop, k, mix, sources) if stop != stops[-1] else want_all
            assert got.tolist() == want.tolist(), (kind, stop, k, world)
            assert counter.counts(stop).sum() == schedule.start(stop)
        fresh = SourceCounter(layout, n, SEED, k, mix).per_epoch(stops[0])
        assert fresh.tolist() == counter.per_epoch(stops[0]).tolist()  # going back: counted afresh, the same
        checked[kind] += 1


@pytest.mark.parametrize("budget", [False, True])
def test_batches_by_shape_count_the_epoch_that_completes_each_batch(budget: bool) -> None:
    rng = np.random.default_rng(1)
    n = 60
    buckets = rng.integers(0, 3, size=n)
    if budget:
        cost = rng.integers(1, 10, size=n)
        stream = ShapeStream(n, SEED, buckets, max_cost=20, cost=cost)
    else:
        stream = ShapeStream(n, SEED, buckets, batch_size=4)
    counter = SourceCounter(ShapeLayout(stream), n, SEED)
    for stop in (0, 7, 30, 45):
        want: dict[int, int] = {}
        for t in range(stop):
            e = stream.epoch_of(t)
            _, _, offsets = stream.table(e)
            i = t - stream.steps_before(e)
            want[e] = want.get(e, 0) + int(offsets[i + 1] - offsets[i])
        rows = max(want) + 1 if want else 0
        assert counter.per_epoch(stop)[:, 0].tolist() == [want.get(e, 0) for e in range(rows)]


def test_a_long_run_costs_its_epochs_not_its_steps() -> None:
    """Ten million steps of a plain stream and of a mix by steps: closed forms, answered at once."""
    layout = StepLayout(BatchSchedule.of({0: 512, 1000: 1024}))
    counter = SourceCounter(layout, 1_000_000_000, SEED)
    table = counter.per_epoch(10_000_000)
    assert table.sum() == layout.schedule.start(10_000_000) and table[0, 0] == 1_000_000_000
    sizes = [10**9, 10**8]
    mix = MixPlan.from_sources(sizes, [Source("a.txt", weight=3), Source("b.txt", weight=1)], 10**9)
    step_mix = StepMix.of(sizes, 10**9, ["weight", "weight"], [{0: 1, 5_000_000: 3}, 1])
    got = SourceCounter(StepLayout(BatchSchedule.of(1024), step_mix), 10**9, SEED, 1, mix).counts(10_000_000)
    assert got.sum() == 1024 * 10_000_000
    assert got.tolist() == [5_000_000 * 512 + 5_000_000 * 768, 5_000_000 * 512 + 5_000_000 * 256]


def test_a_count_starts_from_the_nearest_known_prefix() -> None:
    """The epoch in progress of a mix by epochs is counted from the nearest prefix known (its start or end, an
    anchor, an earlier count), forwards or backwards, evaluating only the draws between: the same counts."""
    mix = MixPlan((50, 30, 7), (40, 30, 10), 80)  # 80 draws an epoch: global batches of 4, epoch 1 = steps 20-39
    layout = StepLayout(BatchSchedule.of(4))

    def counter() -> SourceCounter:
        return SourceCounter(layout, 80, SEED, 1, mix)

    truth = {t: counter().per_epoch(t).tolist() for t in (27, 30, 31, 38, 39)}
    near_end = counter()
    assert near_end.per_epoch(39).tolist() == truth[39] and near_end.evaluated == 4  # from the epoch's end
    anchored = counter()
    epoch, at, draws = counter().prefix(30 * 4)  # what a state saved at step 30 carries
    assert (epoch, at) == (1, 40)
    anchored.anchor(epoch, at, draws.tolist())
    assert anchored.per_epoch(30).tolist() == truth[30] and anchored.evaluated == 0
    assert anchored.per_epoch(31).tolist() == truth[31] and anchored.evaluated == 4
    assert anchored.per_epoch(27).tolist() == truth[27] and anchored.evaluated == 4 + 12  # backwards from 30
    assert anchored.per_epoch(38).tolist() == truth[38] and anchored.evaluated == 4 + 12 + 8  # from the end
    with pytest.raises(ValueError, match="an anchor counts 3 sources, got 2"):
        anchored.anchor(1, 4, [1, 3])
