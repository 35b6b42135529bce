from __future__ import annotations

import functools
import itertools
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset.plan import mix
from rank_dataset.plan.counts import mix_counts, mix_draws
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.permutation import permute
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec, spread_positions

S = Source
# (sizes, sources, epoch_size): weighted, fixed, mixed; up- and down-weighted; T0 a multiple of W*M or not.
MIXES: list[tuple[list[int], list[Source], int | None]] = [
    ([10, 7, 3], [S("a", weight=1), S("b", weight=2), S("c", weight=3)], None),
    ([100, 5], [S("a"), S("b", weight=1)], 150),
    ([13, 29, 4], [S("a", repeat=0.5), S("b", choose=9), S("c", repeat=2.5)], None),
    ([1], [S("a")], None),
    ([17, 1, 8], [S("a", weight=3), S("b", repeat=4), S("c", weight=0.5)], 61),
    ([1000, 30, 7], [S("a", weight=5), S("b", weight=1), S("c", weight=1)], 257),
    ([50, 50], [S("a", choose=13), S("b", choose=31)], None),
    ([6, 9], [S("a", repeat=0.7), S("b", weight=2)], 23),
    ([3, 40], [S("a", repeat=50), S("b", choose=24)], None),  # 150 of 3 samples: 50 passes an epoch
    ([64, 32], [S("a"), S("b")], None),  # T0 = 96, divisible by every W*M below but 8*5
]
IDS = [f"mix{i}" for i in range(len(MIXES))]
SEED = 11


def plan_of(case: tuple[list[int], list[Source], int | None]) -> MixPlan:
    return MixPlan.from_sources(*case)


def rank_positions(t0: int, w: int, m: int, r: int, i: int, epoch: int) -> np.ndarray:
    """The epoch-order positions that rank ``r`` reads in mini-epoch ``i`` (plan's layout over ``T0``)."""
    spec = ShardSpec(t0, w, r, mini_epoch=m, mini_epoch_idx=i, seed=SEED, epoch=epoch)
    positions = spread_positions(*spec.mini_epoch_span, w, r)
    # These are the positions ShardSpec itself uses: its indices are the permuted slots.
    assert np.array_equal(spec.indices(), permute(t0, SEED, epoch, positions % t0))
    return positions


def epoch_picks(plan: MixPlan, w: int, m: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples and source ids of one epoch, over all ranks and mini-epochs, padding left out."""
    t0 = plan.epoch_size
    got = [plan.locate(SEED, epoch, rank_positions(t0, w, m, r, i, epoch)) for r in range(w) for i in range(m)]
    positions = np.concatenate([rank_positions(t0, w, m, r, i, epoch) for r in range(w) for i in range(m)])
    samples, ids = np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])
    real = positions < t0
    assert np.array_equal(np.sort(positions[real]), np.arange(t0))  # every slot exactly once
    # Padding holds what the wrapped position holds.
    pad_samples, pad_ids = plan.locate(SEED, epoch, positions[~real] % t0)
    assert np.array_equal(samples[~real], pad_samples) and np.array_equal(ids[~real], pad_ids)
    return samples[real], ids[real]


def stream(plan: MixPlan, source: int, epochs: int) -> np.ndarray:
    """Source ``source``'s picks of epochs ``0..epochs-1``, in stream order (slot order within an epoch)."""
    start = sum(plan.counts[:source])
    parts = []
    for e in range(epochs):
        slots = permute(plan.epoch_size, SEED, e, np.arange(plan.epoch_size))
        samples = plan.epoch_order(SEED, e, np.arange(plan.epoch_size))
        by_slot = np.empty_like(samples)
        by_slot[slots] = samples
        parts.append(by_slot[start : start + plan.counts[source]])
    return np.concatenate(parts)


@pytest.mark.parametrize("case", MIXES, ids=IDS)
@pytest.mark.parametrize(("w", "m"), list(itertools.product([1, 2, 3, 4, 8], [1, 2, 5])))
def test_each_epoch_takes_exactly_the_counts(case: Any, w: int, m: int) -> None:
    plan = plan_of(case)
    offsets = np.cumsum((0, *plan.sizes))
    for epoch in [0, 1, 4]:
        samples, ids = epoch_picks(plan, w, m, epoch)
        assert np.array_equal(np.bincount(ids, minlength=len(plan.sizes)), plan.counts)
        assert np.array_equal(plan.source_of(samples), ids)
        assert (samples >= offsets[ids]).all() and (samples < offsets[ids + 1]).all()


@pytest.mark.parametrize("case", MIXES, ids=IDS)
def test_each_epoch_is_the_same_for_every_world_size(case: Any) -> None:
    plan = plan_of(case)
    for epoch in [0, 3]:
        picks = [np.sort(epoch_picks(plan, w, 2, epoch)[0]) for w in [1, 3, 4, 8]]
        for other in picks[1:]:
            assert np.array_equal(other, picks[0])


@pytest.mark.parametrize("case", MIXES, ids=IDS)
def test_no_sample_repeats_before_its_source_is_exhausted(case: Any) -> None:
    plan = plan_of(case)
    offsets = np.cumsum((0, *plan.sizes))
    for s, (n, c) in enumerate(zip(plan.sizes, plan.counts)):
        epochs = max(3, -(-3 * n // c))  # at least three passes of the source
        picks = stream(plan, s, epochs)
        full = len(picks) // n
        passes = picks[: full * n].reshape(full, n)
        assert (np.sort(passes, axis=1) == np.arange(offsets[s], offsets[s + 1])).all()
        tail = picks[full * n :]
        assert len(np.unique(tail)) == len(tail)
        if n > 2 and full >= 2:  # passes are reshuffled, not the same order again
            assert not all(np.array_equal(passes[0], p) for p in passes[1:])


@pytest.mark.parametrize("case", MIXES, ids=IDS)
def test_counts_per_sample_follow_the_ratio(case: Any) -> None:
    plan = plan_of(case)
    offsets = np.cumsum((0, *plan.sizes))
    for s, (n, c) in enumerate(zip(plan.sizes, plan.counts)):
        seen = np.zeros(n, np.int64)
        for e in range(6):
            samples, ids = epoch_picks(plan, 1, 1, e)
            once = np.bincount(samples[ids == s] - offsets[s], minlength=n)
            # From epoch 0 on, each sample has been taken floor or ceil of (epochs * ratio) times.
            seen += once
            assert set(seen.tolist()) <= {(e + 1) * c // n, -(-(e + 1) * c // n)}
            # In one epoch: the same, when the epoch starts or ends on a pass boundary; else one off at most.
            lo, hi = c // n, -(-c // n)
            if (e * c) % n == 0 or ((e + 1) * c) % n == 0:
                assert set(once.tolist()) <= {lo, hi}
            else:
                assert lo - 1 <= once.min() and once.max() <= hi + 1


def test_up_weighted_source_sees_each_sample_floor_or_ceil_of_its_ratio() -> None:
    # 40 samples up-weighted to 130 an epoch (ratio 3.25); the first epoch starts on a pass boundary.
    plan = MixPlan.from_sources([40, 200], [S("small", weight=13), S("big", weight=20)], 330)
    assert plan.counts == (130, 200)
    samples, ids = epoch_picks(plan, 4, 3, 0)
    once = np.bincount(samples[ids == 0], minlength=40)
    assert sorted(set(once.tolist())) == [3, 4] and once.sum() == 130
    # An integer ratio gives every sample exactly that many times in every epoch.
    plan = MixPlan.from_sources([7, 10], [S("x", repeat=3), S("y")])
    for e in range(4):
        samples, ids = epoch_picks(plan, 3, 2, e)
        assert np.array_equal(np.bincount(samples[ids == 0], minlength=7), [3] * 7)


def test_the_documented_layout() -> None:
    plan = MixPlan.from_sources([5, 3], [S("a", repeat=0.6), S("b", repeat=2)])
    assert (plan.counts, plan.epoch_size) == ((3, 6), 9)
    for seed, epoch in [(0, 0), (SEED, 1), (-3, 7)]:
        expect = []
        for slot in permute(9, seed, epoch, np.arange(9)).tolist():
            s, j = (0, slot) if slot < 3 else (1, slot - 3)
            n, c, offset = plan.sizes[s], plan.counts[s], (0, 5)[s]
            t = epoch * c + j
            expect.append(int(permute(n, mix.source_seed(seed, s), t // n, [t % n])[0]) + offset)
        samples, ids = plan.locate(seed, epoch, np.arange(9))
        assert samples.tolist() == expect
        assert ids.tolist() == [0 if x < 5 else 1 for x in expect]


def test_order_is_fixed_by_seed_and_epoch() -> None:
    plan = plan_of(MIXES[5])
    pos = np.arange(plan.epoch_size)
    a = plan.epoch_order(1, 2, pos)
    assert np.array_equal(a, plan.epoch_order(1, 2, pos))
    assert not np.array_equal(a, plan.epoch_order(2, 2, pos))
    assert not np.array_equal(a, plan.epoch_order(1, 3, pos))
    # Two sources of the same size get different streams.
    twins = MixPlan.from_sources([50, 50], [S("a"), S("b")])
    assert not np.array_equal(stream(twins, 0, 2), stream(twins, 1, 2) - 50)


def test_locate_keeps_the_shape_and_rejects_bad_positions() -> None:
    plan = plan_of(MIXES[0])
    pos = np.arange(40).reshape(4, 10)
    samples, ids = plan.locate(0, 0, pos)
    assert samples.shape == ids.shape == (4, 10) and samples.dtype == ids.dtype == np.int64
    assert np.array_equal(samples.ravel(), plan.epoch_order(0, 0, pos.ravel() % plan.epoch_size))
    empty = plan.locate(0, 0, np.empty(0, np.int64))
    assert empty[0].shape == empty[1].shape == (0,)
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        plan.locate(0, 0, [3, -1])
    with pytest.raises(TypeError, match="positions must be integers"):
        plan.locate(0, 0, [1.5])
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        plan.locate(0, -1, [0])


def _calls(run: Callable[[], object]) -> int:
    """The Python and C function calls ``run`` makes (a loop over samples or epochs would make millions)."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_memory_and_work_stay_o_positions() -> None:
    sources = [S("a", weight=1), S("b", weight=2), S("c", repeat=0.001), S("d", choose=7)]
    plan = MixPlan.from_sources([600_000_000, 300_000_000, 100_000_000, 3], sources, 10**9)
    assert plan.epoch_size == 10**9
    pos = np.random.default_rng(0).integers(0, 3 * 10**9, 1000)  # padding positions too
    tracemalloc.start()
    for epoch in [0, 1, 10**6]:
        samples, ids = plan.locate(SEED, epoch, pos)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # a T0- or N-sized array would be gigabytes
    # The work: a few hundred calls, whatever N (10^9 here) and the epoch (a per-epoch loop would be 10^6).
    calls = [_calls(functools.partial(plan.locate, SEED, epoch, pos)) for epoch in [0, 1, 10**6]]
    assert max(calls) < 2_000, calls
    assert (samples >= 0).all() and (samples < plan.num_samples).all()
    assert np.array_equal(plan.source_of(samples), ids)


# --- mix_counts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "sources", "epoch_size", "expect"),
    [
        ([100, 10], [S("a"), S("b", repeat=2.5)], None, ([100, 25], 125)),  # no weight: sum of fixed
        ([100, 10], [S("a", weight=1), S("b", weight=3)], None, ([28, 82], 110)),  # weights: total samples
        ([100, 10], [S("a", weight=1), S("b", repeat=3)], None, ([80, 30], 110)),
        ([10, 10, 10], [S("a", weight=1), S("b", weight=1), S("c", weight=1)], 11, ([4, 4, 3], 11)),  # ties: earlier
        ([10, 10], [S("a", weight=0.5), S("b", weight=1.0)], 10, ([3, 7], 10)),  # 3.33 and 6.67
        ([10, 10], [S("a", repeat=0.25), S("b", repeat=0.35)], None, ([2, 4], 6)),  # round(): 2.5 -> 2, 3.5 -> 4
        ([5], [S("a", choose=12)], None, ([12], 12)),  # choose may exceed N
        ([5, 5], [S("a", choose=2), S("b", repeat=0.6)], 5, ([2, 3], 5)),  # fixed counts that fill epoch_size
    ],
)
def test_mix_counts(sizes: list[int], sources: list[Source], epoch_size: int | None, expect: Any) -> None:
    assert mix_counts(sizes, sources, epoch_size) == expect


def test_weighted_counts_always_sum_exactly_and_follow_the_weights() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        k = int(rng.integers(1, 6))
        weights = rng.uniform(0.01, 10, k)
        total = int(rng.integers(1000, 10**6))
        counts, t0 = mix_counts([7] * k, [S(f"s{i}", weight=float(w)) for i, w in enumerate(weights)], total)
        assert t0 == total == sum(counts)
        assert np.abs(np.asarray(counts) - total * weights / weights.sum()).max() < 1


@pytest.mark.parametrize(
    ("sizes", "sources", "epoch_size", "message"),
    [
        ([10, 10], [S("a"), S("b", choose=5)], 12, r"fixed per-epoch counts of the sources \('a': 10, 'b': 5\)"),
        ([10, 5], [S("a", weight=1), S("b", repeat=4)], None, "add up to 20, more than the epoch size, by default"),
        ([1000, 10], [S("big", weight=1000), S("tiny", weight=1)], 100, "share of source.s. 'tiny' rounds to 0"),
        ([10, 10], [S("a", weight=1), S("b", choose=10)], 10, "'a' rounds to 0 of the 0 samples"),
        ([3], [S("a", repeat=0.1)], None, "source 'a': repeat=0.1 of its 3 samples rounds to 0"),
        ([10, 10], [S("a"), S("b")], 30, "add up to 20, less than epoch_size=30, and no source has a weight"),
        ([10, 0], [S("a"), S("empty")], None, "size of source 'empty' must be >= 1, got 0"),
        ([10], [S("a"), S("b")], None, "sizes has 1 entries for 2 sources"),
        ([], [], None, "sources must not be empty"),
        ([10], [S("a")], 0, "epoch_size must be >= 1, got 0"),
        ([2**62], [S("a", repeat=2)], None, r"epoch size must be in \[1, 2\*\*62\]"),
    ],
)
def test_mix_counts_errors(sizes: list[int], sources: list[Source], epoch_size: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mix_counts(sizes, sources, epoch_size)


def test_mix_counts_type_errors() -> None:
    with pytest.raises(TypeError, match="sources must be a list of Source"):
        mix_counts([1], S("a"), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sources\[1\] must be a Source"):
        mix_counts([1, 1], [S("a"), "b"], None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"size of source 'a' must be an int, got 1\.0"):
        mix_counts([1.0], [S("a")], None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="epoch_size must be an int"):
        mix_counts([1], [S("a")], 2.0)  # type: ignore[arg-type]


# --- Source ---------------------------------------------------------------------------------------------


def test_source_defaults_and_normalisation() -> None:
    a = Source(Path("data/x/train.txt"))
    assert a.paths == ("data/x/train.txt",) and a.name == "train.txt"
    assert (a.weight, a.repeat, a.choose, a.parser) == (None, 1.0, None, None)
    assert a == Source("data/x/train.txt", repeat=1) and hash(a) == hash(Source("data/x/train.txt"))
    b = Source(["p/1.txt", Path("p/2.txt")], weight=np.float32(2), parser="label", name="both")
    assert b.paths == ("p/1.txt", "p/2.txt") and b.weight == 2.0 and isinstance(b.weight, float) and b.name == "both"
    assert Source("a", choose=np.int64(3)).choose == 3
    assert Source("a", parser=json.loads).parser is json.loads
    assert Source("dir/").name == "dir/"  # no file name: the whole path
    with pytest.raises(AttributeError):
        a.weight = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"paths": []}, ValueError, "non-empty list of paths, got an empty list"),
        ({"paths": 3}, TypeError, "paths must be a path or a list of paths, got 3"),
        ({"paths": ["a", 3]}, TypeError, r"paths\[1\] must be a str or os.PathLike, got 3"),
        ({"paths": ["a", ""]}, ValueError, r"paths\[1\] is an empty path"),
        ({"paths": b"a"}, TypeError, "paths must be a path or a list of paths"),
        ({"weight": 1, "repeat": 2}, ValueError, "at most one of weight, repeat and choose, got weight and repeat"),
        ({"repeat": 1, "choose": 2}, ValueError, "got repeat and choose"),
        ({"weight": 0}, ValueError, "weight must be a finite number > 0, got 0"),
        ({"weight": float("nan")}, ValueError, "weight must be a finite number > 0, got nan"),
        ({"weight": "1"}, TypeError, "weight must be a number, got '1'"),
        ({"repeat": -0.5}, ValueError, "repeat must be a finite number > 0, got -0.5"),
        ({"repeat": float("inf")}, ValueError, "repeat must be a finite number > 0"),
        ({"repeat": True}, TypeError, "repeat must be a number, got True"),
        ({"choose": 0}, ValueError, "choose must be >= 1, got 0"),
        ({"choose": 2.0}, TypeError, "choose must be an int, got 2.0"),
        ({"parser": "csv"}, ValueError, "parser must be None, 'json', 'label' or a callable"),
        ({"name": ""}, ValueError, "name must not be empty"),
        ({"name": 5}, TypeError, "name must be a str, got 5"),
    ],
)
def test_source_errors(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    kwargs = {"paths": "a.txt", **kwargs}
    with pytest.raises(error, match=message):
        Source(**kwargs)


# --- MixPlan ----------------------------------------------------------------------------------------------


def test_mix_plan_round_trips_and_hashes() -> None:
    plan = plan_of(MIXES[2])
    assert json.loads(json.dumps(plan.to_dict())) == plan.to_dict()
    assert MixPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert len({plan, plan_of(MIXES[2]), plan_of(MIXES[3])}) == 2
    assert plan.num_samples == 46
    assert MixPlan([3], [4], 4) == MixPlan((3,), (4,), 4)  # lists are stored as tuples  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (((), (), 1), ValueError, "non-empty and equally long"),
        (((3, 4), (4,), 4), ValueError, "non-empty and equally long"),
        (((3,), (4,), 5), ValueError, r"epoch_size must be sum\(counts\) = 4, got 5"),
        (((0,), (4,), 4), ValueError, r"sizes\[0\] must be >= 1, got 0"),
        (((3,), (0,), 0), ValueError, r"counts\[0\] must be >= 1, got 0"),
        (((3,), (True,), 1), TypeError, r"counts\[0\] must be an int"),
        ((3, (3,), 3), TypeError, "sizes must be a sequence of ints"),
        (((2**62, 1), (1, 1), 2), ValueError, "at most 2\\*\\*62"),
    ],
)
def test_mix_plan_errors(args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        MixPlan(*args)


def test_mix_plan_from_dict_errors() -> None:
    with pytest.raises(ValueError, match="exactly the keys"):
        MixPlan.from_dict({"sizes": [1], "counts": [1]})
    with pytest.raises(ValueError, match="exactly the keys"):
        MixPlan.from_dict({"sizes": [1], "counts": [1], "epoch_size": 1, "seed": 0})


# -- repeated augmentation: draws of the mixed order ---------------------------------------------------


def source_stream_reference(n: int, key: int, stop: int) -> np.ndarray:
    """The first ``stop`` positions of a source's stream, O(stop): pass j is the (key, j) permutation."""
    return np.concatenate([permute(n, key, j, np.arange(n)) for j in range(max(1, -(-stop // n)))])[:stop]


def aug_mix_reference(plan: MixPlan, k: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """An epoch's samples and source ids at positions 0..T0-1, from each source's stream, O(T0 + stream)."""
    draws = mix_draws(plan.counts, k)
    total = sum(draws)
    assert total == -(-plan.epoch_size // k)
    owner = np.repeat(np.arange(len(draws)), draws)  # draw slot -> source
    first = np.cumsum((0, *draws[:-1]))
    slot_sample = np.empty(total, np.int64)
    for s, (n, d) in enumerate(zip(plan.sizes, draws)):
        key = mix.source_seed(SEED, s)
        taken = source_stream_reference(n, key, (epoch + 1) * d)[epoch * d :]  # stream positions e*d..
        slot_sample[first[s] : first[s] + d] = taken + sum(plan.sizes[:s])
    slots = permute(total, SEED, epoch, np.arange(total))  # the draw order interleaves the slots
    samples, ids = slot_sample[slots], owner[slots]
    return np.repeat(samples, k)[: plan.epoch_size], np.repeat(ids, k)[: plan.epoch_size]


AUG_MIXES = [case for case in MIXES if min(MixPlan.from_sources(*case).counts) >= 4]


@pytest.mark.parametrize("case", AUG_MIXES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_aug_repeats_mix_is_the_reference(case: Any, k: int) -> None:
    plan = plan_of(case)
    t0 = plan.epoch_size
    for epoch in [0, 1, 5]:
        samples, ids = aug_mix_reference(plan, k, epoch)
        got = plan.locate(SEED, epoch, np.arange(t0), k)
        assert np.array_equal(got[0], samples) and np.array_equal(got[1], ids)
        pad = plan.locate(SEED, epoch, np.arange(t0, 2 * t0 + 3), k)[0]  # padding wraps
        assert np.array_equal(pad, np.resize(samples, t0 + 3))
        if k == 1:  # without repeats each epoch takes exactly the counts
            assert np.array_equal(np.bincount(got[1], minlength=len(plan.sizes)), plan.counts)


@pytest.mark.parametrize("k", [2, 3])
def test_aug_repeats_mix_walks_each_stream(k: int) -> None:
    plan = MixPlan.from_sources([30, 12], [S("a"), S("b")])  # counts 30 and 12: k divides both
    seen = [np.zeros(30, np.int64), np.zeros(12, np.int64)]
    for epoch in range(k):
        samples, ids = plan.locate(SEED, epoch, np.arange(plan.epoch_size)[::k], k)
        for s in (0, 1):
            seen[s] += np.bincount(samples[ids == s] - sum(plan.sizes[:s]), minlength=plan.sizes[s])
    assert all((x == 1).all() for x in seen)  # k epochs of repeat=1 sources: every sample drawn once


@pytest.mark.parametrize(
    ("counts", "k"), [([6, 3, 2], 2), ([9, 8, 2], 2), ([100, 7, 1000], 3), ([5, 5], 4), ([1, 1, 1], 1), ([13], 5)]
)
def test_mix_draws_share_the_draws_by_the_counts(counts: list[int], k: int) -> None:
    draws = mix_draws(counts, k)
    total = sum(counts)
    assert sum(draws) == -(-total // k)
    for c, d in zip(counts, draws):
        assert abs(d - c * sum(draws) / total) < 1
        if all(x % k == 0 for x in counts):
            assert d == c // k
    assert mix_draws(counts, 1) == counts


def test_mix_draws_refuse_a_source_too_small_for_a_draw() -> None:
    with pytest.raises(ValueError, match="source 'books' takes 1 of the epoch's 101 samples"):
        mix_draws([100, 1], 3, ["web", "books"])
    with pytest.raises(ValueError, match="aug_repeats must be >= 1"):
        mix_draws([100, 1], 0)
    assert mix_draws([100, 0, 4], 4) == [25, 0, 1]  # a source with no count gets no draw


# -- schedules: rules that change from an epoch on -------------------------------------------------


def test_a_schedule_is_a_rule_per_first_epoch() -> None:
    s = S("a", weight={10: 3, 0: 1, 4: 2.5})
    assert s.weight == {0: 1.0, 4: 2.5, 10: 3.0} and list(s.weight) == [0, 4, 10]  # sorted by epoch
    assert (s.kind, s.changes) == ("weight", (4, 10))
    assert [s.value_at(e) for e in (0, 3, 4, 9, 10, 99)] == [1.0, 1.0, 2.5, 2.5, 3.0, 3.0]
    assert s.at(5) == S("a", weight=2.5) and s.at(5).changes == ()
    assert S("a", choose={0: 5}) == S("a", choose=5)  # a schedule of epoch 0 alone is its value
    assert S("a", repeat={0: 1, 3: 0.5}).at(3).repeat == 0.5
    assert S("a", choose={0: 5, 2: 7}).describe(2) == "choose=7"
    assert S("a").changes == () and S("a").at(7) == S("a")
    assert len({s, S("a", weight={0: 1, 10: 3, 4: 2.5}), S("a", weight=1)}) == 2  # hashable, by value


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"weight": {1: 2}}, ValueError, r"a weight schedule must hold epoch 0 \(the rule from the start\), got"),
        ({"weight": {}}, ValueError, "a weight schedule must hold epoch 0"),
        ({"repeat": {0: 1, -1: 2}}, ValueError, "repeat schedule epoch must be >= 0, got -1"),
        ({"choose": {0: 1, "5": 2}}, TypeError, "choose schedule epoch must be an int, got '5'"),
        ({"weight": {0: 1, 5: 0}}, ValueError, r"weight\[5\] must be a finite number > 0, got 0"),
        ({"choose": {0: 3, 5: 2.5}}, TypeError, r"choose\[5\] must be an int"),
        ({"weight": {0: 1}, "choose": {0: 1}}, ValueError, "at most one of weight, repeat and choose"),
    ],
)
def test_bad_schedules_are_named(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        S("a", **kwargs)


# (sizes, sources, epoch_size): schedules of every kind, changes at different epochs, a change that
# leaves the counts as they were, and T0 fixed by epoch_size or by the sizes.
SCHEDULES: list[tuple[list[int], list[Source], int | None]] = [
    ([20, 9, 5], [S("a", weight={0: 1, 3: 4}), S("b", repeat={0: 1, 2: 2.5}), S("c", choose={0: 3, 5: 8})], 40),
    ([30, 7], [S("a", weight={0: 1, 4: 1}), S("b", weight={0: 1, 2: 3, 6: 0.5})], None),
    ([11, 6, 40], [S("a", choose={0: 4, 1: 12}), S("b", choose={0: 6, 3: 2}), S("c", weight=1)], 30),
]


def reference_counts(case: Any, epoch: int) -> list[int]:
    """The counts of one epoch, from the rules in force at it (each source with its schedule flattened)."""
    sizes, sources, epoch_size = case
    return mix_counts(sizes, [s.at(epoch) for s in sources], epoch_size)[0]


@pytest.mark.parametrize("case", SCHEDULES)
def test_each_epoch_takes_the_counts_in_force(case: Any) -> None:
    plan = plan_of(case)
    assert plan.changes and len({c for _, c in plan.changes}) == len(plan.changes)
    for epoch in range(10):
        expect = reference_counts(case, epoch)
        assert list(plan.counts_at(epoch)) == expect and sum(expect) == plan.epoch_size
        for w, m in [(1, 1), (3, 2)]:
            _samples, ids = epoch_picks(plan, w, m, epoch)
            assert np.bincount(ids, minlength=len(plan.sizes)).tolist() == expect
    # the stream positions: the sum of the earlier counts (draws with k > 1), epoch by epoch
    for k in (1, 2):
        running = [0] * len(plan.sizes)
        for epoch in range(40):
            assert list(plan.stream_starts(epoch, k)) == running
            running = [a + b for a, b in zip(running, mix_draws(plan.counts_at(epoch), k))]


@pytest.mark.parametrize("case", SCHEDULES)
def test_each_stream_continues_across_a_change(case: Any) -> None:
    plan = plan_of(case)
    t0 = plan.epoch_size
    epochs = 12
    for s, n in enumerate(plan.sizes):
        counts = [reference_counts(case, e)[s] for e in range(epochs)]
        reference = source_stream_reference(n, mix.source_seed(SEED, s), sum(counts)) + sum(plan.sizes[:s])
        start = 0
        for epoch, c in enumerate(counts):
            slots = permute(t0, SEED, epoch, np.arange(t0))
            samples = plan.epoch_order(SEED, epoch, np.arange(t0))
            by_slot = np.empty_like(samples)
            by_slot[slots] = samples
            first = sum(reference_counts(case, epoch)[:s])
            assert np.array_equal(by_slot[first : first + c], reference[start : start + c])
            start += c
            # the cumulative bound holds across the changes: floor or ceil of taken / N
            taken = np.bincount(reference[:start] - sum(plan.sizes[:s]), minlength=n)
            assert set(taken.tolist()) <= {start // n, -(-start // n)}


def test_a_schedule_keeps_the_epoch_size() -> None:
    with pytest.raises(ValueError, match="schedule of source 'b' changes the epoch size from 15 to 20 at epoch 3"):
        MixPlan.from_sources([10, 5], [S("a"), S("b", choose={0: 5, 3: 10})])
    with pytest.raises(ValueError, match=r"add up to 20, more than epoch_size=15 \(at epoch 3, by the schedules\)"):
        MixPlan.from_sources([10, 5], [S("a", weight=1), S("b", choose={0: 5, 3: 20})], 15)
    with pytest.raises(ValueError, match=r"'b': repeat=0\.01 of its 5 samples rounds to 0 per epoch from epoch 2"):
        MixPlan.from_sources([10, 5], [S("a", weight=1), S("b", repeat={0: 1, 2: 0.01})], 15)
    plan = MixPlan.from_sources([10, 5], [S("a", weight=1), S("b", choose={0: 5, 3: 10})], 15)
    assert plan.changes == ((3, (5, 10)),) and MixPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert "changes" not in MixPlan.from_sources([10, 5], [S("a"), S("b")]).to_dict()


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (((0, (5, 5)),), ValueError, r"changes\[0\] first epoch must be >= 1"),
        (((3, (5, 5)), (3, (4, 6))), ValueError, r"changes\[1\] first epoch must be >= 4, got 3"),
        (((3, (5, 6)),), ValueError, r"changes\[0\] counts must be 2 counts summing to epoch_size=10"),
        (((3, (10, 0)),), ValueError, r"changes\[0\] counts\[1\] must be >= 1"),
        (((3, 5),), TypeError, r"changes\[0\] counts must be a sequence"),
        ((3,), TypeError, r"changes\[0\] must be a pair"),
    ],
)
def test_bad_changes_are_named(changes: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        MixPlan((8, 8), (5, 5), 10, changes)


@pytest.mark.parametrize("trial", range(30))
def test_a_mix_of_many_sources_locates_as_one_of_few(trial: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past a few sources, locate evaluates every source's permutations at once: the same numbers.
    from rank_dataset.plan import mix

    rng = np.random.default_rng(trial)
    s = int(rng.integers(2, 60))
    k = int(rng.integers(1, 4))  # repeated augmentation: draws of the mixed order, streams from their bases
    counts = tuple(k * int(x) for x in rng.integers(1, 200, s))
    plan = MixPlan(tuple(int(x) for x in rng.integers(1, 50, s)), counts, sum(counts))
    seed, epoch = int(rng.integers(-5, 2**40)), int(rng.integers(0, 100))
    positions = rng.integers(0, 2 * plan.epoch_size, 500)
    monkeypatch.setattr(mix, "_FEW_SOURCES", 10**9)
    one_by_one = plan.locate(seed, epoch, positions, k)
    monkeypatch.setattr(mix, "_FEW_SOURCES", 0)
    together = plan.locate(seed, epoch, positions, k)
    assert all(np.array_equal(a, b) for a, b in zip(one_by_one, together))


@pytest.mark.parametrize("passes", ["within one", "across two", "many", "too many for a table"])
@pytest.mark.parametrize("trial", range(4))
def test_many_sources_locate_as_few_however_many_passes_an_epoch_makes(
    passes: str, trial: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rank_dataset.plan import mix

    rng = np.random.default_rng(trial)
    s = int(rng.integers(17, 80))
    sizes = rng.integers(1000, 2000, s)
    if passes == "within one":
        counts = sizes // 3
    elif passes == "across two":
        counts = sizes // 2 + rng.integers(0, 400, s)
    elif passes == "many":
        counts = sizes * int(rng.integers(2, 9)) + rng.integers(0, 999, s)
    else:
        sizes = rng.integers(1, 3, s)
        counts = rng.integers(20_000, 40_000, s)
    plan = MixPlan(tuple(sizes.tolist()), tuple(counts.tolist()), int(counts.sum()))
    seed, epoch = int(rng.integers(0, 2**40)), int(rng.integers(0, 7))
    positions = rng.integers(0, plan.epoch_size, 3000)
    monkeypatch.setattr(mix, "_FEW_SOURCES", 10**9)
    one_by_one = plan.locate(seed, epoch, positions)
    monkeypatch.setattr(mix, "_FEW_SOURCES", 0)
    together = plan.locate(seed, epoch, positions)
    assert all(np.array_equal(a, b) for a, b in zip(one_by_one, together))


@pytest.mark.parametrize("seed", [0, 1, -5, 2**63 + 7, 2**70, -(2**64) - 3])
def test_the_source_seeds_of_many_sources_are_those_of_one(seed: int) -> None:
    from rank_dataset.plan.mix import source_seed, source_seeds

    assert source_seeds(seed, 2000).tolist() == [source_seed(seed, s) for s in range(2000)]
