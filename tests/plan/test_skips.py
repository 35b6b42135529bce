"""Skipped step ranges (plan.skips), one global batch planned alone (StepLayout.batch, ShapeLayout.batch), and the
manifest's array references (plan.manifest)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rank_dataset.plan.manifest import ArrayRef, array_digest, check_manifest
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.shapes import ShapeLayout, ShapeStream
from rank_dataset.plan.skips import Skips
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.steps import StepLayout


def random_ranges(rng: np.random.Generator, span: int) -> list[tuple[int, int]]:
    """Disjoint ranges inside ``[0, span)``, some touching, in a random order."""
    cuts = np.sort(rng.choice(span, size=2 * int(rng.integers(0, 6)), replace=False))
    ranges = [(int(a), int(b)) for a, b in cuts.reshape(-1, 2)]
    if len(ranges) >= 2 and rng.random() < 0.5:  # two that touch: [a, b) and [b, c)
        ranges[1] = (ranges[0][1], max(ranges[1][1], ranges[0][1] + 1))
    rng.shuffle(ranges)
    return ranges


@pytest.mark.parametrize("seed", range(30))
def test_loop_steps_receive_the_kept_data_batches(seed: int) -> None:
    rng = np.random.default_rng(seed)
    span = 200
    ranges = random_ranges(rng, span)
    skips = Skips.of(ranges)
    skipped = {d for a, b in ranges for d in range(a, b)}
    kept = [d for d in range(span + 100) if d not in skipped]  # the definition: the kept batches, in order
    for step, batch in enumerate(kept[:span]):
        assert skips.batch_of(step) == batch
        assert not skips.skipped(batch)
    for d in skipped:
        assert skips.skipped(d)
    # What a pass draws: the items of the kept batches of a window from a given batch on.
    first, sizes = int(rng.integers(0, 50)), rng.integers(1, 5, size=int(rng.integers(1, 120)))
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    for start in range(first, first + sizes.size):
        expected = sum(int(sizes[u - first]) for u in range(start, first + sizes.size) if u not in skipped)
        assert skips.kept_items(bounds, first, start) == expected
    # Sorted, the same on any order given, and read back from its list.
    assert Skips.of(skips.to_list()) == skips == Skips.of(sorted(ranges))


def test_merging_skips() -> None:
    s = Skips.of([(10, 20)])
    assert s.add(10, 20) is s  # the same range twice counts once
    assert s.merge(Skips.of([(10, 20), (30, 35)])).ranges == ((10, 20), (30, 35))
    assert s.add(20, 25).ranges == ((10, 20), (20, 25))  # touching, not overlapping
    with pytest.raises(ValueError, match=r"\[15, 25\) overlaps the skipped range \[10, 20\)"):
        s.add(15, 25)
    with pytest.raises(ValueError, match=r"overlaps"):
        s.merge(Skips.of([(5, 11)]))
    with pytest.raises(ValueError, match=r"skip\[0\] = \[5, 5\) is empty"):
        Skips.of([(5, 5)])
    with pytest.raises(ValueError, match=r"skip\[1\] first must be in \[0, "):
        Skips.of([(1, 2), (-1, 3)])
    with pytest.raises(TypeError, match=r"skip\[0\] must be a \(first, stop\) pair"):
        Skips.of([(1, 2, 3)])
    with pytest.raises(TypeError, match="skip must be a list"):
        Skips.of("1:2")
    assert not Skips.of(None) and Skips.of([]).ranges == ()


def window_blocks(layout: StepLayout, n: int, seed: int, k: int, world: int, mini: int, mix: Any = None) -> list[Any]:
    """Every global batch of the first windows, from the ranks' shards: each rank's block of each step of its
    window's shard, concatenated in rank order (what the ranks' DataLoaders yield)."""
    batches: dict[int, list[int]] = {}
    for epoch in range(3):
        for m in range(mini):
            first, stop = layout.steps_of(n, mini, epoch, m, k)
            for r in range(world):
                spec = ShardSpec(
                    n, world, r, mini_epoch=mini, mini_epoch_idx=m, seed=seed, epoch=epoch, mix=mix,
                    aug_repeats=k, steps=layout,
                )  # fmt: skip
                items = spec.indices().tolist()
                at = 0
                for u in range(first, stop):
                    block = layout.schedule.size(u) // world
                    batches.setdefault(u, []).extend(items[at : at + block])
                    at += block
    return [batches[u] for u in sorted(batches)]


@pytest.mark.parametrize("seed", range(8))
def test_one_batch_alone_is_the_ranks_blocks_of_its_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 2]))
    world = int(rng.choice([1, 2, 4]))
    n = int(rng.integers(20, 60))
    sizes = [int(x) * 4 * k for x in rng.integers(1, 4, size=3)]
    schedule = BatchSchedule.of({0: sizes[0], 3: sizes[1], 7: sizes[2]})
    mix, step_mix = None, None
    if seed % 2:  # a mix whose rules change by step
        from rank_dataset.plan.mix import MixPlan

        src = [n, 13]
        mix = MixPlan(tuple(src), (n - 10, 10), n)
        step_mix = StepMix.of(src, n, ["weight", "choose"], [1, {0: 10, 5: 4}])
    layout = StepLayout(schedule, step_mix)
    mini = int(rng.integers(1, 4))
    expected = window_blocks(layout, n, seed, k, world, mini, mix)
    for u, batch in enumerate(expected):
        samples, bounds = layout.batch(u, n, seed, k, mix, world)
        assert samples.tolist() == batch
        assert bounds.tolist() == [r * schedule.size(u) // world for r in range(world + 1)]
    with pytest.raises(ValueError, match="not a multiple of the world size 3"):
        layout.batch(0, n, seed, k, mix, 3)


@pytest.mark.parametrize("by", ["count", "budget"])
def test_one_batch_by_shape_is_the_ranks_shares(by: str) -> None:
    rng = np.random.default_rng(3)
    n = 90
    buckets = rng.integers(0, 3, size=n)
    if by == "count":
        stream = ShapeStream(n, 4, buckets, batch_size=6)
    else:
        stream = ShapeStream(n, 4, buckets, max_cost=40, cost=rng.integers(1, 10, size=n))
    layout = ShapeLayout(stream)
    for world in (1, 2):
        for u in range(25):
            if by == "budget" and layout.batch(u, n, 4)[0].size < world:  # a bucket's last run: refused, as by shares
                with pytest.raises(ValueError, match=f"global batch {u} holds"):
                    layout.batch(u, n, 4, world_size=world)
                continue
            samples, bounds = layout.batch(u, n, 4, world_size=world)
            shares = [stream.share(u, u + 1, world, r)[0] for r in range(world)]
            assert bounds.tolist() == np.cumsum([0, *(s.size for s in shares)]).tolist()
            assert samples.tolist() == layout.indices(np.concatenate(shares), n, 4, 0).tolist()
        if by == "count":  # the batch in stream order, the ranks' contiguous blocks of it: one list on any world size
            assert all(
                layout.batch(u, n, 4, world_size=2)[0].tolist() == layout.batch(u, n, 4)[0].tolist() for u in range(25)
            )


def test_array_references() -> None:
    values = np.array([5, 1, 9], np.int32)
    ref = ArrayRef.of("ids.npy", values)
    assert ref.length == 3 and ref.sha256 == array_digest(values.astype(np.int64))
    assert ArrayRef.from_dict(ref.to_dict(), "ids") == ref
    assert ref.check(values, "ids").dtype == np.int64
    with pytest.raises(ValueError, match=r"manifest ids: ids\.npy is not the array the manifest was written with"):
        ref.check(np.array([5, 1, 8]), "ids")
    with pytest.raises(ValueError, match="1-D integer array"):
        ref.check(np.array([5.0, 1.0, 9.0]), "ids")
    with pytest.raises(ValueError, match="manifest x must be null or"):
        ArrayRef.from_dict({"path": "a"}, "x")
    assert ArrayRef.from_dict(None, "x") is None


def test_check_manifest_names_what_is_wrong() -> None:
    with pytest.raises(TypeError, match="manifest is a dict"):
        check_manifest([1])
    with pytest.raises(ValueError, match="not a rank_dataset manifest"):
        check_manifest({"files": []})
    with pytest.raises(ValueError, match="manifest of format 7"):
        check_manifest({"rank_dataset_manifest": 7})
    with pytest.raises(ValueError, match="missing exclude, files"):
        check_manifest(
            {
                "rank_dataset_manifest": 1,
                "num_samples": 3,
                "reload_cfg": {},
                "sources": None,
                "mix": None,
                "steps": None,
            }
        )
