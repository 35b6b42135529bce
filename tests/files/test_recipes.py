"""class_balanced and repeat_factor end to end, against references computed plainly in the test."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import RankDataset, class_balanced, repeat_factor
from rank_dataset.core.parsers import parse_label


def epoch_order(sources: list, cfg: dict, world: int) -> list[int]:
    """The epoch's sample numbers by position, gathered from every rank's shard (padding left out)."""
    by_position: dict[int, int] = {}
    for rank in range(world):
        ds = RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=world)
        total = ds.spec.num_samples
        for p, sample in zip(ds.spec.positions().tolist(), ds.indices.tolist()):
            if p < total:
                assert by_position.setdefault(p, sample) == sample
    assert sorted(by_position) == list(range(len(by_position)))
    return [by_position[p] for p in range(len(by_position))]


def labels_of(path: Path) -> list[int]:
    return [parse_label(line)[1] for line in path.read_text().splitlines() if line.strip()]


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """The reference apportionment: floors, then one more for the largest remainders (earlier first)."""
    whole = sum(Fraction(w) for w in weights)
    quotas = [total * Fraction(w) / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    for i in sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))[: total - sum(counts)]:
        counts[i] += 1
    return counts


@pytest.fixture
def long_tail(write_meta) -> Path:
    rng = np.random.default_rng(0)
    labels = np.minimum(rng.zipf(1.6, 3000), 40)  # a long tail: class 1 huge, many classes tiny
    return write_meta(f"img/{i}.jpg {v}" for i, v in enumerate(labels.tolist()))


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
def test_class_balanced_counts_every_epoch(long_tail: Path, power: float) -> None:
    labels = labels_of(long_tail)
    sizes = Counter(labels)
    classes = sorted(sizes)
    sources = class_balanced(long_tail, power=power)
    assert [s.name for s in sources] == [f"{long_tail.name}[{c}]" for c in classes]
    want = largest_remainder(len(labels), [sizes[c] ** power for c in classes])
    for epoch in range(2):
        order = epoch_order(sources, {"seed": 5, "epoch": epoch}, world=4)
        assert len(order) == len(labels)  # the default epoch: as many samples as the file holds
        got = Counter(labels[i] for i in order)
        assert [got[c] for c in classes] == want


def test_class_balanced_epoch_is_the_same_on_any_world_size(long_tail: Path) -> None:
    sources = class_balanced(long_tail, power=0.5)
    cfg = {"seed": 1, "epoch": 3, "epoch_size": 2400}
    assert epoch_order(sources, cfg, 1) == epoch_order(sources, cfg, 3) == epoch_order(sources, cfg, 8)


def test_each_class_is_used_whole_before_repeats(long_tail: Path) -> None:
    # Over epochs, each sample of a class has been read floor or ceil of its class's share.
    labels = labels_of(long_tail)
    sources = class_balanced(long_tail, power=0.0)
    sizes = Counter(labels)
    per_class = largest_remainder(len(labels), [1.0] * len(sizes))
    reads: Counter[int] = Counter()
    for epoch in range(3):
        reads.update(epoch_order(sources, {"seed": 2, "epoch": epoch}, world=2))
    for c, count in zip(sorted(sizes), per_class):
        share = 3 * count / sizes[c]
        members = [i for i, v in enumerate(labels) if v == c]
        assert {reads[i] for i in members} <= {math.floor(share), math.ceil(share)}


@pytest.mark.parametrize("factor_kind", ["array", "npy"])
def test_repeat_factor_reads_each_sample_floor_or_ceil_of_its_share(
    write_meta, tmp_path: Path, factor_kind: str
) -> None:
    n = 900
    p = write_meta(f"img/{i}.jpg {i % 7}" for i in range(n))
    rng = np.random.default_rng(3)
    factors = rng.choice([1.0, 2.0, 3.0, 1.5, 0.5, 2.25], n)
    arg: object = factors
    if factor_kind == "npy":
        np.save(tmp_path / "r.npy", factors)
        arg = tmp_path / "r.npy"
    sources = repeat_factor(p, arg)
    assert [s.repeat for s in sources] == [0.5, 1.0, 1.5, 2.0, 2.25, 3.0]
    groups = {r: [i for i in range(n) if factors[i] == r] for r in sorted(set(factors.tolist()))}
    epoch_size = sum(round(r * len(g)) for r, g in groups.items())
    reads: Counter[int] = Counter()
    for epoch in range(4):
        order = epoch_order(sources, {"seed": 0, "epoch": epoch}, world=3)
        assert len(order) == epoch_size
        this = Counter(order)
        for r, g in groups.items():
            assert sum(this[i] for i in g) == round(r * len(g))  # the group's count, every epoch
            if r == int(r):
                assert {this[i] for i in g} == {int(r)}  # an integer factor: exactly r times
        reads.update(order)
        for r, g in groups.items():
            share = (epoch + 1) * round(r * len(g)) / len(g)
            assert {reads[i] for i in g} <= {math.floor(share), math.ceil(share)}


def test_repeat_factor_by_the_lvis_rule(write_meta) -> None:
    lines = []
    rng = np.random.default_rng(4)
    for i in range(600):
        cats = rng.choice(20, rng.integers(1, 4), replace=False) ** 2 % 17
        lines.append(f"img/{i}.jpg " + ",".join(map(str, cats.tolist())))
    p = write_meta(lines)

    def categories(line: str) -> list[str]:
        return line.rsplit(" ", 1)[1].split(",")

    t = 0.1
    cats = [set(categories(line)) for line in lines]
    f = {c: sum(c in cs for cs in cats) / len(cats) for c in set().union(*cats)}
    r = [max([1.0] + [math.sqrt(t / f[c]) for c in cs]) for cs in cats]
    grid = [max(round(x * 16), 1) / 16 for x in r]
    sources = repeat_factor(p, categories=categories, threshold=t)
    assert {s.repeat: s.ids.view().tolist() for s in sources} == {
        g: [i for i, x in enumerate(grid) if x == g] for g in sorted(set(grid))
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "either factors"),
        ({"factors": [1.0, 2.0]}, "one factor per sample: 3"),
        ({"factors": [1.0, 0.0, 2.0]}, "> 0, got 0.0 for sample 1"),
        ({"factors": [1.0, 1.0, 1.0], "threshold": 0.1}, "threshold goes with categories"),
        ({"categories": lambda line: [1]}, "needs threshold"),
    ],
)
def test_repeat_factor_arguments(write_meta, kwargs: dict, match: str) -> None:
    p = write_meta(["a 1", "b 2", "c 3"])
    with pytest.raises(ValueError, match=match):
        repeat_factor(p, **kwargs)


def test_recipes_mix_with_other_sources(long_tail: Path, write_meta) -> None:
    from rank_dataset import Source

    other = write_meta(f"other/{i} 0" for i in range(100))
    sources = [*class_balanced(long_tail), Source(other, choose=300)]
    order = epoch_order(sources, {"seed": 0}, world=2)
    assert len(order) == 3000 + 100  # a weighted mix's default epoch: every source's samples
    ds = RankDataset(sources, rank=0, world_size=1)
    assert ds.meta.paths == (long_tail.resolve(), other.resolve())  # the file once, then the other
    assert sum(1 for i in order if i >= 3000) == 300
