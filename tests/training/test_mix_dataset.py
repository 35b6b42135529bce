"""Mixing at the dataset level: RankDataset and RankServerDataset over a list of Source.

The pure properties of the mix's order are in test_mix.py; here the same properties are checked on
what ranks actually hold, over many mixes, world sizes, mini-epochs and epochs, plus items, parsers,
resume on another world size, parity with a real meta server, and the errors.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset import RankDataset, RankServerDataset, Source
from rank_dataset.plan.mix import MixPlan
from tests_helpers import start_methods

SEED = 5
# (file sizes, source rules, epoch_size): each rule is the keyword arguments of a Source.
CASES: list[tuple[list[int], list[dict[str, Any]], int | None]] = [
    ([40, 13, 6], [{"weight": 2}, {"repeat": 0.5}, {"choose": 17}], None),  # T0 = 59: no W*M divides it
    ([30, 10], [{"weight": 3}, {"weight": 1}], 48),  # T0 = 48: divisible by most W*M below
    ([7, 25, 3], [{"repeat": 2.5}, {"weight": 1}, {"choose": 9}], 60),
    ([12], [{"choose": 30}], None),  # one source, 2.5 passes an epoch
    ([5, 50], [{"repeat": 4}, {"repeat": 0.3}], None),
]
LAYOUTS = [(1, 1), (2, 3), (3, 2), (4, 1), (5, 4)]
EPOCHS = 4


def write_sources(write_meta: Callable[..., Path], sizes: list[int], prefix: str = "s") -> list[Path]:
    """One file per source; line ``k`` of file ``s`` is ``"<prefix><s>/<k> <k>"``."""
    return [
        write_meta([f"{prefix}{s}/{k} {k}" for k in range(n)], name=f"{prefix}{s}.txt") for s, n in enumerate(sizes)
    ]


def sources_of(paths: list[Path], rules: list[dict[str, Any]], **extra: Any) -> list[Source]:
    return [Source(p, **rule, **extra) for p, rule in zip(paths, rules)]


def ranks(source: Any, w: int, m: int, epoch_size: int | None, **kw: Any) -> list[RankDataset]:
    cfg = {"seed": SEED, "mini_epoch": m, "epoch_size": epoch_size}
    return [RankDataset(source, reload_cfg=cfg, rank=r, world_size=w, **kw) for r in range(w)]


def read_epoch(datasets: list[Any], m: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples, source ids and a padding mask of everything the ranks read in ``epoch``."""
    samples, ids, padding = [], [], []
    for mini in range(m):
        for ds in datasets:
            ds.set_epoch(epoch, mini)
            positions = ds.spec.positions()
            samples.append(ds.indices)
            ids.append(ds.source_ids)
            padding.append(positions >= ds.spec.num_samples)
    return np.concatenate(samples), np.concatenate(ids), np.concatenate(padding)


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_epochs_take_exact_counts_the_same_on_every_world_size(write_meta, case) -> None:
    sizes, rules, epoch_size = case
    sources = sources_of(write_sources(write_meta, sizes), rules)
    plan = MixPlan.from_sources(sizes, sources, epoch_size)
    offsets = np.cumsum([0, *sizes])
    totals = {w_m: np.zeros(sum(sizes), np.int64) for w_m in LAYOUTS}
    for epoch in range(EPOCHS):
        reference = None
        for w, m in LAYOUTS:
            datasets = ranks(sources, w, m, epoch_size)
            assert len({len(ds) for ds in datasets}) == 1  # equal per-rank lengths
            assert len(datasets[0]) == -(-plan.epoch_size // (w * m))  # R = ceil(T0 / (W*M))
            samples, ids, padding = read_epoch(datasets, m, epoch)
            assert np.array_equal(ids, np.searchsorted(offsets, samples, side="right") - 1)
            assert padding.sum() == len(samples) - plan.epoch_size
            real = np.sort(samples[~padding])
            # exactly c_s samples of source s, whatever W and M (and whether W*M divides T0)
            assert np.bincount(ids[~padding], minlength=len(sizes)).tolist() == list(plan.counts)
            if reference is None:
                reference = real
            assert np.array_equal(real, reference)  # the epoch's multiset is the same on every world size
            totals[(w, m)] += np.bincount(real, minlength=sum(sizes))
            # cumulative: after e+1 epochs each sample of s was taken floor or ceil of (e+1)*c_s/N_s times
            for s, (n, c) in enumerate(zip(sizes, plan.counts)):
                got = totals[(w, m)][offsets[s] : offsets[s + 1]]
                low = (epoch + 1) * c // n
                assert got.min() >= low and got.max() <= low + ((epoch + 1) * c % n > 0), (s, epoch)
                if epoch == 0 and c <= n:  # the first pass: no sample repeats before the source is exhausted
                    assert np.unique(samples[~padding & (ids == s)]).size == c


@pytest.mark.parametrize(("w", "m"), [(1, 1), (3, 2), (4, 3)])
def test_items_come_from_their_source_with_its_parser(write_meta, w: int, m: int) -> None:
    paths = write_sources(write_meta, [20, 9])
    json_path = write_meta([json.dumps({"k": k}) for k in range(6)], name="j.txt")
    sources = [
        Source(paths[0], weight=1),  # the dataset's parser ("label")
        Source(paths[1], repeat=2, parser=str.upper),
        Source(json_path, choose=4, parser="json"),
    ]
    for ds in ranks(sources, w, m, 40, parser="label"):
        for mini in range(m):
            ds.set_epoch(1, mini)
            offsets = [s.offset for s in ds.sources or ()]
            assert not ds.source_ids.flags.writeable and not ds.indices.flags.writeable
            items = [ds[i] for i in range(len(ds))]
            assert items == ds.__getitems__(list(range(len(ds))))
            for item, sample, source in zip(items, ds.indices.tolist(), ds.source_ids.tolist()):
                k = sample - offsets[source]
                assert item == [(f"s0/{k}", k), f"S1/{k} {k}", {"k": k}][source]


def test_sources_describe_the_mix(write_meta) -> None:
    paths = write_sources(write_meta, [40, 13, 6])
    sources = sources_of(paths, CASES[0][1])
    ds = RankDataset(sources, reload_cfg={"seed": 1}, rank=0, world_size=2)
    info = ds.sources
    assert info is not None
    assert [(s.name, s.num_samples, s.count, s.offset) for s in info] == [
        ("s0.txt", 40, 36, 0),
        ("s1.txt", 13, 6, 40),
        ("s2.txt", 6, 17, 53),
    ]
    assert [s.target for s in info] == [36.0, 6.5, 17.0] and info[2].passes == 17 / 6
    assert ds.num_samples == 59 and ds.spec.num_samples == 59 and ds.reload_cfg.epoch_size is None
    assert "mix of 3 sources" in repr(ds)
    plain = RankDataset(paths[0], rank=0, world_size=1)
    assert plain.sources is None and plain.source_ids is None
    # several files as one source: numbered over the files in order
    two = RankDataset([Source(paths[:2], choose=10), Source(paths[2], weight=1)], reload_cfg={"epoch_size": 20})
    assert [(s.num_samples, s.count) for s in two.sources or ()] == [(53, 10), (6, 10)]
    assert all(
        two.meta[int(i)].startswith(("s0/", "s1/") if s == 0 else "s2/") for i, s in zip(two.indices, two.source_ids)
    )


def test_eval_reads_every_sample_once_sources_in_order(write_meta) -> None:
    sizes = [40, 13, 6]
    sources = sources_of(write_sources(write_meta, sizes), CASES[0][1])
    for w in (1, 3, 7):
        datasets = [RankDataset(sources, is_test=True, rank=r, world_size=w) for r in range(w)]
        got = np.concatenate([ds.indices for ds in datasets])
        assert np.array_equal(got, np.arange(59))  # no weights, no shuffle, no padding
        assert np.array_equal(np.concatenate([ds.source_ids for ds in datasets]), np.repeat([0, 1, 2], sizes))
        assert [s.count for s in datasets[0].sources or ()] == sizes
        assert datasets[0][0] == "s0/0 0" and datasets[-1][len(datasets[-1]) - 1] == "s2/5 5"


def test_resume_a_mix_from_four_ranks_onto_three(write_meta) -> None:
    sizes, rules, epoch_size = CASES[0]
    sources = sources_of(write_sources(write_meta, sizes), rules)
    plan = MixPlan.from_sources(sizes, sources, epoch_size)
    m, epoch = 2, 3
    old = ranks(sources, 4, m, epoch_size)
    for ds in old:
        ds.set_epoch(epoch, 0)
    first = [(ds.spec.positions(), ds.indices.copy()) for ds in old]  # mini-epoch 0, read whole
    for ds in old:
        ds.set_epoch(epoch, 1)
    r_ = len(old[0])
    for consumed in sorted({0, 1, r_ // 2, r_}):
        state = json.loads(json.dumps(old[0].state_dict(consumed)))
        assert all(ds.state_dict(consumed) == state for ds in old)
        assert state["mix"]["epoch_size"] == plan.epoch_size
        assert [s["count"] for s in state["mix"]["sources"]] == list(plan.counts)
        before = [(ds.spec.positions()[:consumed], ds.indices[:consumed]) for ds in old]
        new = ranks(sources, 3, 1, epoch_size)  # another M too: the state's replaces it
        for ds in new:
            ds.load_state_dict(state)
        assert len({len(ds) for ds in new}) == 1
        after = [(ds.spec.positions(), ds.indices) for ds in new]
        positions = np.concatenate([p for p, _ in first + before + after])
        samples = np.concatenate([s for _, s in first + before + after])
        # nothing lost: every position of the epoch's plan (T = R*W*M) read
        unique, where = np.unique(positions, return_index=True)
        assert np.array_equal(unique, np.arange(r_ * 4 * m))
        # each position holds what the plan says, and the epoch takes exactly c_s of each source
        assert np.array_equal(samples, plan.epoch_order(SEED, epoch, positions))
        real = samples[where][unique < plan.epoch_size]
        assert np.bincount(plan.source_of(real), minlength=3).tolist() == list(plan.counts)
        # no repeat beyond padding: the plan's own (T - T0) and the spread of the rest over 3 ranks
        rest = r_ * 4 - consumed * 4
        spread_padding = -(-rest // 3) * 3 - rest
        assert len(positions) - len(unique) == spread_padding
        for ds in new:  # then the next epoch is planned afresh on 3 ranks
            ds.set_epoch(epoch + 1)
        fresh = ranks(sources, 3, m, epoch_size)
        for ds, f in zip(new, fresh):
            f.set_epoch(epoch + 1)
            assert np.array_equal(ds.indices, f.indices) and np.array_equal(ds.source_ids, f.source_ids)


def test_resume_refuses_another_mix_naming_the_source(write_meta, tmp_path: Path) -> None:
    paths = write_sources(write_meta, [40, 13, 6])
    rules = CASES[0][1]
    state = RankDataset(sources_of(paths, rules), rank=0, world_size=2).state_dict(3)
    other_weight = [Source(paths[0], weight=2), Source(paths[1], repeat=0.6), Source(paths[2], choose=17)]
    with pytest.raises(ValueError, match=r"another mix: source 0 's0.txt' has count 34, the state's has 36"):
        RankDataset(other_weight, rank=0, world_size=2).load_state_dict(state)
    same_size = write_meta([f"x/{k} {k}" for k in range(13)], name="other.txt")
    other_files = sources_of([paths[0], same_size, paths[2]], rules)
    with pytest.raises(ValueError, match=r"source 1 'other.txt' \(the state's 's1.txt'\) has fingerprint"):
        RankDataset(other_files, rank=0, world_size=2).load_state_dict(state)
    fewer = sources_of(paths[:2], rules[:2])
    with pytest.raises(ValueError, match="a mix of 3 sources, this dataset mixes 2"):
        RankDataset(fewer, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"a mix of 3 source\(s\) \('s0.txt', 's1.txt', 's2.txt'\), but this dataset"):
        RankDataset(paths, rank=0, world_size=2).load_state_dict(state)
    plain_state = RankDataset(paths, rank=0, world_size=2).state_dict(3)
    assert "mix" not in plain_state  # states of plain files are unchanged
    with pytest.raises(ValueError, match="for plain meta files, but this dataset mixes 3 sources"):
        RankDataset(sources_of(paths, rules), rank=0, world_size=2).load_state_dict(plain_state)
    # renamed sources over the same files resume fine
    renamed = [Source(p, **r, name=f"n{i}") for i, (p, r) in enumerate(zip(paths, rules))]
    RankDataset(renamed, rank=0, world_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="eval dataset"):
        RankDataset(sources_of(paths, rules), is_test=True, rank=0, world_size=2).load_state_dict(state)


def test_errors_name_the_source(write_meta) -> None:
    a, b = write_sources(write_meta, [10, 4])
    empty = write_meta(["", "  "], name="empty.txt")
    with pytest.raises(ValueError, match=r"source 1 'empty.txt' has no samples"):
        RankDataset([Source(a), Source(empty, weight=1)], rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"fixed per-epoch counts of the sources \('s0.txt': 10, 's1.txt': 8\)"):
        RankDataset([Source(a), Source(b, repeat=2)], reload_cfg={"epoch_size": 12}, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"source 's1.txt': repeat=0.1 of its 4 samples rounds to 0"):
        RankDataset([Source(a), Source(b, repeat=0.1)], rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"weighted share of source\(s\) 's1.txt' rounds to 0"):
        RankDataset([Source(a, weight=100), Source(b, weight=1)], reload_cfg={"epoch_size": 20}, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"epoch_size.*give a list of Source"):
        RankDataset(a, reload_cfg={"epoch_size": 5}, rank=0, world_size=1)
    with pytest.raises(TypeError, match="only Source objects"):
        RankDataset([Source(a), b], rank=0, world_size=1)  # type: ignore[list-item]
    with pytest.raises(FileNotFoundError, match=r"nope.txt"):
        RankDataset([Source(a), Source(a.parent / "nope.txt")], rank=0, world_size=1)
    # eval ignores the weights, and so their errors
    assert len(RankDataset([Source(a), Source(b, repeat=0.1)], is_test=True, rank=0, world_size=1)) == 14


@pytest.mark.slow  # a real server, one pass linger a request
def test_server_parity(write_meta, start_server) -> None:
    sizes = [40, 13, 6, 9]
    paths = write_sources(write_meta, sizes)
    server = start_server(paths)
    files = requests_json(f"{server.url}/files")["files"]
    assert [(f["name"], f["num_samples"]) for f in files] == [(p.name, n) for p, n in zip(paths, sizes)]
    mixes: list[tuple[list[Source], list[Source], int | None]] = [
        # local sources, the same by served names, epoch_size
        (
            [Source(paths[2], weight=2), Source(paths[0], repeat=0.5, parser="label"), Source(paths[1], choose=17)],
            [Source("s2.txt", weight=2), Source("s0.txt", repeat=0.5, parser="label"), Source("s1.txt", choose=17)],
            50,
        ),
        (
            [Source(paths[1:4:2], weight=1), Source(paths[0], choose=7)],
            [Source(["s1.txt", "s3.txt"], weight=1), Source("s0.txt", choose=7)],
            None,
        ),
    ]
    for local_sources, served_sources, epoch_size in mixes:
        for (w, m), is_test in itertools.product([(1, 1), (3, 2), (4, 3)], [False, True]):
            cfg = {"seed": 2, "mini_epoch": m, "mini_epoch_idx": m - 1, "epoch": 1, "epoch_size": epoch_size}
            for r in sorted({0, w - 1}):
                local = RankDataset(local_sources, is_test=is_test, reload_cfg=cfg, rank=r, world_size=w)
                remote = RankServerDataset(
                    server.url, is_test=is_test, reload_cfg=cfg, rank=r, world_size=w, sources=served_sources
                )
                assert np.array_equal(local.indices, remote.indices)
                assert np.array_equal(local.source_ids, remote.source_ids)
                assert [local[i] for i in range(len(local))] == [remote[i] for i in range(len(remote))]
                assert [s.fingerprint for s in local.sources or ()] == [s.fingerprint for s in remote.sources or ()]
                if is_test:
                    continue
                local.set_epoch(2, 0)
                remote.set_epoch(2, 0)
                assert np.array_equal(local.indices, remote.indices)
                state = local.state_dict(1)
                assert remote.state_dict(1) == state
                resumed = RankServerDataset(server.url, rank=0, world_size=2, sources=served_sources, reload_cfg=cfg)
                resumed_local = RankDataset(local_sources, rank=0, world_size=2, reload_cfg=cfg)
                resumed.load_state_dict(state)
                resumed_local.load_state_dict(state)
                assert np.array_equal(resumed.indices, resumed_local.indices)
    # without sources: every served file as one, as before
    plain = RankServerDataset(server.url, rank=1, world_size=2)
    assert np.array_equal(plain.indices, RankDataset(paths, rank=1, world_size=2).indices)
    with pytest.raises(ValueError, match=r"source 1 'b.txt': .* serves no file named 'b.txt' \(it serves s0.txt"):
        RankServerDataset(server.url, rank=0, world_size=1, sources=[Source("s0.txt"), Source("b.txt")])
    with pytest.raises(ValueError, match=r"sources \('s0.txt': 50\) add up to 50, more than epoch_size=10"):
        RankServerDataset(
            server.url, rank=0, world_size=1, sources=[Source("s0.txt", choose=50)], reload_cfg={"epoch_size": 10}
        )


def test_serve_refuses_two_files_of_one_name(tmp_path: Path) -> None:
    import subprocess
    import sys

    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "train.txt").write_text("a 1\n")
    cmd = [sys.executable, "-m", "rank_dataset", "serve", str(tmp_path / "x/train.txt"), str(tmp_path / "y/train.txt")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "two served files share the name 'train.txt'" in out.stderr


def requests_json(url: str) -> Any:
    import requests

    return requests.get(url, timeout=10).json()


@pytest.mark.parametrize("context", start_methods("fork", "spawn"))
def test_dataloader_workers_and_stateful_loader(write_meta, context: str) -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from rank_dataset import ResumableSampler, find_resume_state

    paths = write_sources(write_meta, [50, 20])
    sources = [Source(paths[0], weight=1), Source(paths[1], repeat=1.5, parser="label")]
    ds = RankDataset(sources, reload_cfg={"seed": 4}, rank=1, world_size=2)
    expect = [ds[i] for i in range(len(ds))]
    loader = DataLoader(ds, batch_size=8, num_workers=1, collate_fn=list, multiprocessing_context=context)
    assert [x for batch in loader for x in batch] == expect
    stateful = StatefulDataLoader(ds, batch_size=8, sampler=ResumableSampler(ds), collate_fn=list)
    for k, _ in enumerate(stateful):
        if k == 2:
            saved = json.loads(json.dumps(stateful.state_dict()))
            break
    again = RankDataset(sources, reload_cfg={"seed": 4}, rank=1, world_size=2)
    again.load_state_dict(find_resume_state(saved))
    assert [again[i] for i in range(len(again))] == expect[24:]


def test_a_mix_of_many_sources_reaches_persistent_workers(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from rank_dataset import RandomSampler

    sources = []
    for s in range(600):  # a plan of several KiB for the workers (sizes and counts of every source)
        path = tmp_path / f"s{s}.txt"
        path.write_text(f"s{s}_a {s}\ns{s}_b {s}\n")
        sources.append(Source(path, choose=1))
    ds = RankDataset(sources, rank=0, world_size=2)
    loader = DataLoader(ds, batch_size=4096, sampler=RandomSampler(ds), num_workers=1, persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = sorted(x for batch in loader for x in batch)
        assert got == sorted(ds[i] for i in range(len(ds)))
    del loader


def test_aug_repeats_in_a_mix_pairs_copies_on_ranks_and_matches_the_server(write_meta, start_server) -> None:
    paths = write_sources(write_meta, [40, 14, 6])
    rules: list[dict[str, Any]] = [{"weight": 2}, {"repeat": 1}, {"choose": 12}]
    cfg = {"seed": SEED, "mini_epoch": 2, "epoch_size": 64, "aug_repeats": 2}
    datasets = [RankDataset(sources_of(paths, rules), reload_cfg=cfg, rank=r, world_size=4) for r in range(4)]
    plan = datasets[0].spec.mix
    assert plan is not None and plan.draws(2) == tuple(c // 2 for c in plan.counts)  # 2 divides every count
    for epoch in range(3):
        samples, ids, padding = read_epoch(datasets, 2, epoch)
        assert not padding.any()  # 64 positions, 4 ranks x 2 mini-epochs
        assert np.array_equal(np.bincount(ids, minlength=3), plan.counts)  # k divides the counts: exact
        assert (np.bincount(samples) % 2 == 0).all()  # every draw read twice
        for mini in range(2):
            for ds in datasets:
                ds.set_epoch(epoch, mini)
            assert np.array_equal(datasets[0].indices, datasets[1].indices)
            assert np.array_equal(datasets[2].indices, datasets[3].indices)
            assert not set(datasets[0].indices.tolist()) & set(datasets[2].indices.tolist())
    server = start_server(paths)
    served = [Source(p.name, **rule) for p, rule in zip(paths, rules)]
    for r in (0, 3):
        local = RankDataset(sources_of(paths, rules), reload_cfg={**cfg, "epoch": 2}, rank=r, world_size=4)
        remote = RankServerDataset(server.url, reload_cfg={**cfg, "epoch": 2}, rank=r, world_size=4, sources=served)
        assert np.array_equal(local.indices, remote.indices)
        assert [local[i] for i in range(len(local))] == [remote[i] for i in range(len(remote))]
    with pytest.raises(ValueError, match=r"source 's2.txt' takes 1 of the epoch's 64 samples, too few for one draw"):
        RankDataset(sources_of(paths, [{"weight": 1}, {"repeat": 1}, {"choose": 1}]), reload_cfg=cfg, world_size=1)
    with pytest.raises(ValueError, match=r"aug_repeats=2 .*eval mode"):
        RankDataset(sources_of(paths, rules), is_test=True, reload_cfg=cfg, rank=0, world_size=1)


def test_a_schedule_changes_the_counts_and_each_stream_continues(write_meta, start_server) -> None:
    sizes = [40, 14, 6]
    paths = write_sources(write_meta, sizes)
    rules: list[dict[str, Any]] = [{"weight": {0: 1, 3: 3}}, {"repeat": {0: 1, 2: 0.5}}, {"choose": {0: 6, 4: 12}}]
    cfg = {"seed": SEED, "mini_epoch": 2, "epoch_size": 60}
    w, m, epochs = 3, 2, 7
    datasets = ranks(sources_of(paths, rules), w, m, 60)
    # the reference: each epoch's counts from the rules in force, each source's stream walked in order
    per_epoch = [[40, 14, 6], [40, 14, 6], [47, 7, 6], [47, 7, 6], [41, 7, 12], [41, 7, 12], [41, 7, 12]]
    offsets = np.cumsum((0, *sizes))
    taken = np.zeros(3, np.int64)
    seen = [np.zeros(n, np.int64) for n in sizes]
    for epoch in range(epochs):
        samples, ids, padding = read_epoch(datasets, m, epoch)
        assert np.bincount(ids[~padding], minlength=3).tolist() == per_epoch[epoch]
        taken += per_epoch[epoch]
        for s, n in enumerate(sizes):
            seen[s] += np.bincount(samples[~padding][ids[~padding] == s] - offsets[s], minlength=n)
            # the stream continues across the changes: floor or ceil of everything taken so far
            assert set(seen[s].tolist()) <= {int(taken[s]) // n, -(-int(taken[s]) // n)}
        infos = datasets[0].sources
        assert infos is not None
        assert [i.count for i in infos] == per_epoch[epoch] and [i.taken for i in infos] == taken.tolist()
        assert [i.passes_completed for i in infos] == (taken // sizes).tolist()
        assert infos[0].target == pytest.approx(60 - per_epoch[epoch][1] - per_epoch[epoch][2])
    # DataLoader workers get the schedule with the spec, and a meta server in the query
    from torch.utils.data import DataLoader

    from rank_dataset import ResumableSampler

    ds = datasets[2]
    loader = DataLoader(ds, batch_size=4, sampler=ResumableSampler(ds), num_workers=2, collate_fn=list)
    assert [x for batch in loader for x in batch] == [ds[i] for i in range(len(ds))]
    server = start_server(paths)
    served = [Source(p.name, **rule) for p, rule in zip(paths, rules)]
    for epoch in (1, 5):
        local = RankDataset(sources_of(paths, rules), reload_cfg={**cfg, "epoch": epoch}, rank=1, world_size=w)
        remote = RankServerDataset(server.url, reload_cfg={**cfg, "epoch": epoch}, rank=1, world_size=w, sources=served)
        assert np.array_equal(local.indices, remote.indices)
    import requests

    answer = requests.get(
        f"{server.url}/shard",
        params={"world_size": 1, "rank": 0, "mix_files": '[["s0.txt"]]', "mix_sizes": "40", "mix_counts": "5"}
        | {"mix_changes": "[[1,[5.5]]]"},
        timeout=30,
    )
    assert answer.status_code == 400 and "must be an int" in answer.json()["error"]


def test_resume_a_schedule_allows_changes_only_after_the_state_epoch(write_meta) -> None:
    paths = write_sources(write_meta, [40, 14, 6])
    rules: list[dict[str, Any]] = [{"weight": 1}, {"repeat": {0: 1, 2: 0.5}}, {"choose": 6}]
    cfg = {"seed": SEED, "mini_epoch": 2, "epoch_size": 60, "epoch": 3, "mini_epoch_idx": 1}
    old = [RankDataset(sources_of(paths, rules), reload_cfg=cfg, rank=r, world_size=4) for r in range(4)]
    state = old[0].state_dict(3)
    assert state["mix"]["changes"] == [[2, [47, 7, 6]]]
    # the same schedule up to epoch 3 and another one after it: allowed, and the new one takes over
    later = [{"weight": 1}, {"repeat": {0: 1, 2: 0.5, 4: 2}}, {"choose": 6}]
    new = [RankDataset(sources_of(paths, later), reload_cfg={"epoch_size": 60}, rank=r, world_size=3) for r in range(3)]
    for ds in new:
        ds.load_state_dict(state)
    before = np.concatenate([ds.indices[:3] for ds in old])
    after = np.concatenate([ds.indices for ds in new])
    rest = len(old[0]) * 4 - 3 * 4
    assert len(after) == 21 and rest == 20  # 3 ranks of 7: one position of padding, wrapping to the rest's first
    whole = np.concatenate([ds.indices for ds in old])  # the old mini-epoch, planned on 4 ranks
    expect = sorted([*whole.tolist(), int(new[0].indices[0])])
    assert sorted(np.concatenate([before, after]).tolist()) == expect
    for ds in new:
        ds.set_epoch(4)
    counts = np.zeros(3, np.int64)
    for mini in range(2):
        for ds in new:
            ds.set_epoch(4, mini)
            real = ds.spec.positions() < 60
            counts += np.bincount(ds.source_ids[real], minlength=3)
    assert counts.tolist() == [26, 28, 6]  # epoch 4 takes the new schedule's counts
    assert new[0].sources is not None and new[0].sources[1].taken == 14 * 2 + 7 * 2 + 28
    # a difference at or before the state's epoch is refused, naming the source and the epoch
    for bad, epoch in [
        ([{"weight": 1}, {"repeat": {0: 1, 2: 0.5, 3: 2}}, {"choose": 6}], 3),
        ([{"weight": 1}, {"repeat": 1}, {"choose": 6}], 2),
        ([{"weight": 1}, {"repeat": {0: 1, 1: 0.5}}, {"choose": 6}], 1),
    ]:
        ds = RankDataset(sources_of(paths, bad), reload_cfg={"epoch_size": 60}, rank=0, world_size=3)
        with pytest.raises(
            ValueError,
            match=rf"source 0 's0.txt' has count \d+, the state's has \d+; source 1 's1.txt' .*, at epoch {epoch} ",
        ):
            ds.load_state_dict(state)
