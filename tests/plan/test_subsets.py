"""Sources over subsets of their files (Source(paths, ids=...)) on what ranks and workers actually hold."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import RandomSampler, RankDataset, Source, group_by
from rank_dataset.plan.subsets import SampleIds
from tests_helpers import spawn_workers, start_methods


def lines_of(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def files(write_meta) -> tuple[Path, Path]:
    a = write_meta((f"a/{i} {i % 5}" for i in range(500)), name="a.txt")
    b = write_meta((f"b/{i} {i % 2}" for i in range(80)), name="b.txt")
    return a, b


def test_items_are_the_listed_lines_numbered_over_the_distinct_files(files: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = files
    rng = np.random.default_rng(0)
    ids_a1, ids_a2 = rng.choice(500, 60, replace=False), rng.choice(500, 7, replace=False)
    np.save(tmp_path / "b.npy", np.array([79, 3, 40], np.int32))
    sources = [Source(a, ids=ids_a1, weight=1), Source(b, ids=tmp_path / "b.npy", repeat=2), Source(a, ids=ids_a2)]
    ds = RankDataset(sources, reload_cfg={"seed": 3}, rank=1, world_size=2)
    text = lines_of(a) + lines_of(b)  # the distinct files in order of first appearance
    assert ds.meta.paths == (a.resolve(), b.resolve())
    assert [ds[i] for i in range(len(ds))] == [text[s] for s in ds.indices.tolist()]
    members = [set(ids_a1.tolist()), {500 + 79, 500 + 3, 500 + 40}, set(ids_a2.tolist())]
    assert all(s in members[src] for s, src in zip(ds.indices.tolist(), ds.source_ids.tolist()))
    assert isinstance(sources[1].ids.base, np.memmap)  # the .npy is mapped, not loaded


def test_eval_reads_every_listed_sample_once_in_the_listed_order(files: tuple[Path, Path]) -> None:
    a, b = files
    sources = [Source(a, ids=[9, 2, 400, 0], weight=5), Source(b, ids=[1, 0]), Source(a, choose=3)]
    whole = []
    for rank in range(3):
        whole += RankDataset(sources, is_test=True, rank=rank, world_size=3).indices.tolist()
    assert whole == [9, 2, 400, 0, 501, 500, *range(500)]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_subset_counts_and_members_every_epoch(files: tuple[Path, Path], world: int) -> None:
    a, b = files
    ids = np.arange(0, 500, 7)  # 72 samples
    sources = [Source(a, ids=ids, choose=100), Source(b, ids=[5, 6], weight=1), Source(b, weight=1)]
    members = [set(ids.tolist()), {505, 506}, set(range(500, 580))]
    for epoch in range(3):
        got: list[Counter[int]] = [Counter(), Counter(), Counter()]
        for rank in range(world):
            cfg = {"seed": 1, "epoch": epoch, "epoch_size": 140}
            ds = RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=world)
            keep = ds.spec.positions() < 140
            for sample, source in zip(ds.indices[keep].tolist(), ds.source_ids[keep].tolist()):
                got[source][sample] += 1
        assert [sum(c.values()) for c in got] == [100, 20, 20]  # choose, then 1:1 of the 40 left
        assert all(set(c) <= m for c, m in zip(got, members))
        assert got[1] == {505: 10, 506: 10}  # 2 samples, 20 draws: each exactly 10 times
        if epoch == 0:  # the first pass whole before any sample twice
            assert set(got[0].values()) == {1, 2} and len(got[0]) == 72


def test_resume_mid_epoch_on_another_world_size(files: tuple[Path, Path]) -> None:
    a, b = files
    groups = group_by(a)
    sources = [Source(a, ids=v, weight=1, name=f"class {k}") for k, v in groups.items()] + [Source(b, ids=[3, 1])]
    cfg = {"seed": 9, "epoch": 2}
    whole = RankDataset(sources, reload_cfg=cfg, rank=0, world_size=1)
    order = whole.indices.tolist()  # the epoch, position by position
    assert len(order) == whole.spec.num_samples == 502
    before = [RankDataset(sources, reload_cfg=cfg, rank=r, world_size=4) for r in range(4)]
    state = before[0].state_dict(consumed=40)
    assert all(ds.state_dict(consumed=40) == state for ds in before)
    by_position = {}
    for ds in before:
        by_position.update(zip(ds.spec.positions()[:40].tolist(), ds.indices[:40].tolist()))
    for rank in range(3):
        ds = RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=3)
        ds.load_state_dict(state)
        assert ds.spec.mini_epoch_span[0] == 160
        for p, sample in zip(ds.spec.positions().tolist(), ds.indices.tolist()):
            # Past 502 is the plan's padding (what position p mod 502 holds); the resumed ranks' padding
            # repeats positions of the range.
            assert by_position.setdefault(p, sample) == sample == order[p % 502]
    assert [by_position[p] for p in range(502)] == order


def test_another_subset_is_named_when_resuming(files: tuple[Path, Path]) -> None:
    a, _ = files
    state = RankDataset([Source(a, ids=[1, 2, 3], name="picked"), Source(a)], rank=0, world_size=1).state_dict(1)
    other = RankDataset([Source(a, ids=[1, 2, 4], name="picked"), Source(a)], rank=0, world_size=1)
    with pytest.raises(ValueError, match="source 0 'picked'"):
        other.load_state_dict(state)
    same = RankDataset([Source(a, ids=np.array([1, 2, 3], np.int16), name="picked"), Source(a)], rank=0, world_size=1)
    same.load_state_dict(state)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([], "ids is empty"),
        ([3, 1, 3], "lists sample 3 twice"),
        ([0, -2], "holds -2, a negative"),
        ([0, 580], "holds 580, past the last sample of its files \\(580 samples\\)"),
        (np.zeros((2, 2), np.int64), "1-D array of integers"),
        (np.array([0.5]), "1-D array of integers"),
        ([0.5, 2], "1-D array of integers"),  # refused, not truncated to sample 0
        ({1, 2}, "ids must be a 1-D integer array, a list of ints"),  # a set has no order
        (np.arange(580)[::-1].copy()[np.r_[0:300, 299]], "lists sample 280 twice"),  # a repeat in a big list
    ],
)
def test_bad_ids_name_the_source_and_a_value(files: tuple[Path, Path], ids: object, match: str) -> None:
    a, b = files
    with pytest.raises((ValueError, TypeError), match=f"source 'mine': .*{match}"):
        RankDataset([Source([a, b], ids=ids, name="mine")], rank=0, world_size=1)


def test_a_missing_npy_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"source 'x': ids: the file .*nope\.npy' is not a readable \.npy"):
        Source("a.txt", ids=tmp_path / "nope.npy", name="x")


def test_ids_in_a_file_pickle_as_a_reference(files: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = files
    groups = group_by(a)
    source = Source(a, ids=groups[3])
    blob = pickle.dumps(source)
    assert len(blob) < 2000  # not the ids
    back = pickle.loads(blob)
    assert back.ids.view().tolist() == groups[3].tolist() and isinstance(back.ids.base, np.memmap)
    assert back == source
    in_memory = Source(a, ids=np.arange(0, 500, 2))
    assert pickle.loads(pickle.dumps(in_memory)).ids.view().tolist() == list(range(0, 500, 2))


def test_sources_sharing_one_base_array(files: tuple[Path, Path]) -> None:
    a, _ = files
    groups = group_by(a)
    ids = [SampleIds.of(v, str(k)) for k, v in groups.items()]
    assert len({id(x.base) for x in ids}) == 1  # one map: one gather for all of them
    assert [x.view().tolist() for x in ids] == [v.tolist() for v in groups.values()]


@pytest.mark.parametrize(("in_b", "first"), [(False, 0), (False, 1), (False, 3), (True, 1)])
def test_the_classes_of_a_grouping_map_plan_numbers_in_one_gather(
    files: tuple[Path, Path], in_b: bool, first: int
) -> None:
    # Slices of one array, back to back in the sources' order: plan number p is base[p + shift]. The
    # same numbers as the general map, which looks up each number's source first.
    from rank_dataset.plan.subsets import SampleMap

    a, b = files
    groups = list(group_by(b if in_b else a).values())[first:]
    ids = tuple(SampleIds.of(v, str(k)) for k, v in enumerate(groups))
    sizes = tuple(len(v) for v in groups)
    file_bounds = np.array([0, 500, 580])
    one_file = (1,) if in_b else (0,)
    plan = np.random.default_rng(first).integers(0, sum(sizes), 3000)
    source = np.searchsorted(np.cumsum(sizes), plan, side="right")
    want = [int(groups[s][p - sum(sizes[:s])]) + int(file_bounds[one_file[0]]) for p, s in zip(plan, source)]

    def never(_: np.ndarray) -> np.ndarray:
        raise AssertionError("the sources were looked up")

    direct = SampleMap(sizes, (one_file,) * len(groups), file_bounds, ids)
    assert direct.samples(plan, never).tolist() == want
    general = SampleMap(sizes, (one_file,) * len(groups), file_bounds, ids)
    general.__dict__["_slices"] = None
    assert general.samples(plan, lambda p: np.searchsorted(np.cumsum(sizes), p, side="right")).tolist() == want
    if len(groups) > 1:  # out of order: not one gather
        swapped = SampleMap(sizes[::-1], (one_file,) * len(groups), file_bounds, ids[::-1])
        assert swapped._slices is None


@pytest.mark.parametrize("start_method", start_methods("fork", "spawn"))
def test_workers_serve_the_subset_items(files: tuple[Path, Path], start_method: str) -> None:
    a, b = files
    groups = group_by(a)
    sources = [Source(a, ids=v, weight=1, parser="label") for v in groups.values()]
    sources.append(Source(b, ids=np.array([2, 4, 6]), repeat=3, parser="label"))  # in memory: not sent to workers
    ds = RankDataset(sources, reload_cfg={"seed": 4}, rank=0, world_size=2)
    loader = DataLoader(
        ds, batch_size=16, sampler=RandomSampler(ds), num_workers=spawn_workers(start_method),
        multiprocessing_context=start_method, collate_fn=list,
    )  # fmt: skip
    text = lines_of(a) + lines_of(b)
    got = sorted(item for batch in loader for item in batch)
    want = sorted(
        (line.rsplit(" ", 1)[0], int(line.rsplit(" ", 1)[1])) for line in (text[i] for i in ds.indices.tolist())
    )
    assert got == want


@pytest.mark.parametrize("start_method", start_methods("fork", "spawn", "forkserver"))
def test_a_mix_of_20000_sources_works_with_workers_and_resume(write_meta, start_method: str) -> None:
    from torch.utils.data import DataLoader

    from rank_dataset import class_balanced

    p = write_meta(f"img/{i}.jpg {i % 20_000}" for i in range(40_000))  # ImageNet-21k-like: 20,000 classes
    sources = class_balanced(p)
    assert len(sources) == 20_000
    ds = RankDataset(sources, reload_cfg={"seed": 1}, rank=0, world_size=2)
    loader = DataLoader(
        ds, batch_size=4096, sampler=RandomSampler(ds), num_workers=1, persistent_workers=True,
        multiprocessing_context=start_method, collate_fn=list,
    )  # fmt: skip
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sorted(x for batch in loader for x in batch) == sorted(ds[i] for i in range(len(ds)))
    del loader
    state = ds.state_dict(consumed=100)
    other = RankDataset(sources, reload_cfg={"seed": 1}, rank=2, world_size=3)
    other.load_state_dict(state)
    assert len(other) == -(-(40_000 - 200) // 3)  # the rest of the epoch of 40,000, over 3 ranks


def test_a_meta_server_gives_exactly_rank_datasets_shard(
    files: tuple[Path, Path], tmp_path: Path, start_server
) -> None:
    from rank_dataset import RankServerDataset

    a, b = files
    server = start_server([b, a])  # served in another order than the sources name them
    groups = group_by(a)
    np.save(tmp_path / "few.npy", np.array([70, 3, 11]))
    local_sources = [Source(a, ids=v, weight=1, name=f"class {k}") for k, v in groups.items()]
    local_sources += [Source(b, ids=tmp_path / "few.npy", repeat=2), Source(a, choose=20)]
    served_sources = [Source("a.txt", ids=v, weight=1, name=f"class {k}") for k, v in groups.items()]
    served_sources += [Source("b.txt", ids=tmp_path / "few.npy", repeat=2), Source("a.txt", choose=20)]
    for world, is_test in [(1, False), (3, False), (2, True)]:
        for rank in range(world):
            cfg = {"seed": 7, "epoch": 1}
            local = RankDataset(local_sources, is_test=is_test, reload_cfg=cfg, rank=rank, world_size=world)
            remote = RankServerDataset(
                server.url, is_test=is_test, reload_cfg=cfg, rank=rank, world_size=world, sources=served_sources
            )
            assert np.array_equal(local.indices, remote.indices)
            assert np.array_equal(local.source_ids, remote.source_ids)
            assert [local[i] for i in range(len(local))] == [remote[i] for i in range(len(remote))]
            assert [s.fingerprint for s in local.sources] == [s.fingerprint for s in remote.sources]
            if not is_test:
                state = local.state_dict(5)
                assert remote.state_dict(5) == state
                again = RankServerDataset(server.url, rank=0, world_size=2, sources=served_sources, reload_cfg=cfg)
                again.load_state_dict(state)
                mine = RankDataset(local_sources, rank=0, world_size=2, reload_cfg=cfg)
                mine.load_state_dict(state)
                assert np.array_equal(again.indices, mine.indices)


@pytest.mark.parametrize("world", [2, 4])
def test_subsets_with_a_schedule_and_repeated_augmentation(files: tuple[Path, Path], world: int) -> None:
    # A subset keeps its ids when its rule changes (Source.at), and its stream continues across the
    # change: over epochs 0..2 each listed sample is drawn floor or ceil of its cumulative share.
    a, b = files
    ids = np.arange(3, 500, 11)  # 46 samples
    sources = [Source(a, ids=ids, choose={0: 20, 1: 60}), Source(b, weight=1)]
    k, size = 2, 100
    drawn: Counter[int] = Counter()
    for epoch in range(3):
        per_epoch: Counter[int] = Counter()
        for rank in range(world):
            cfg = {"seed": 5, "epoch": epoch, "epoch_size": size, "aug_repeats": k}
            ds = RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=world)
            keep = ds.spec.positions() < size
            picked = ds.indices[keep][ds.source_ids[keep] == 0]
            assert set(picked.tolist()) <= set(ids.tolist())
            per_epoch.update(picked.tolist())
        assert sum(per_epoch.values()) == (20 if epoch == 0 else 60)  # copies: k per draw
        assert all(v % k == 0 for v in per_epoch.values())
        drawn.update({s: v // k for s, v in per_epoch.items()})
    total = (20 + 60 + 60) // k  # draws of the subset over epochs 0..2
    low, high = total // len(ids), -(-total // len(ids))
    assert all(low <= drawn[s] <= high for s in ids.tolist())


@pytest.mark.slow  # a real server, 20,000 sources
def test_20000_subset_sources_through_a_meta_server(write_meta, start_server) -> None:
    # ImageNet-21k-like: 20,000 classes, each a source over a subset of one served file.
    from rank_dataset import RankServerDataset, class_balanced

    p = write_meta((f"img/{i}.jpg {(i * 7919) % 20_000}" for i in range(60_000)), name="m.txt")
    server = start_server([p])
    local_sources = class_balanced(p)
    served_sources = [Source("m.txt", ids=s.ids, weight=s.weight, name=s.name) for s in local_sources]
    assert len(served_sources) == 20_000
    for world, rank, is_test in [(3, 1, False), (2, 0, True)]:
        cfg = {"seed": 5, "epoch": 2}
        local = RankDataset(local_sources, is_test=is_test, reload_cfg=cfg, rank=rank, world_size=world)
        remote = RankServerDataset(
            server.url, is_test=is_test, reload_cfg=cfg, rank=rank, world_size=world, sources=served_sources
        )
        assert np.array_equal(local.indices, remote.indices) and np.array_equal(local.source_ids, remote.source_ids)
        assert [local[i] for i in range(len(local))] == [remote[i] for i in range(len(remote))]
        if not is_test:
            state = remote.state_dict(100)
            assert state == local.state_dict(100)
            again = RankServerDataset(server.url, rank=0, world_size=2, reload_cfg=cfg, sources=served_sources)
            again.load_state_dict(state)
            mine = RankDataset(local_sources, rank=0, world_size=2, reload_cfg=cfg)
            mine.load_state_dict(state)
            assert np.array_equal(again.indices, mine.indices)
