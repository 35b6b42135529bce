"""Exact resume: the properties of issue 5 over many (N, W, W2, M, consumed)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from rank_dataset import RankDataset, ResumableSampler, find_resume_state
from rank_dataset.plan import ShardSpec
from rank_dataset.plan.permutation import permute


def datasets(meta: Path, w: int, m: int, **cfg: int) -> list[RankDataset]:
    return [RankDataset(meta, reload_cfg={"mini_epoch": m, "seed": 3, **cfg}, rank=r, world_size=w) for r in range(w)]


CASES = list(itertools.product([7, 20, 101], [1, 3, 4], [1, 2, 5], [1, 2]))


@pytest.mark.parametrize(("n", "w", "w2", "m"), CASES)
def test_union_before_and_after_is_the_mini_epoch(write_meta, n: int, w: int, w2: int, m: int) -> None:
    meta = write_meta(n=n)
    for mini in range(m):
        old = datasets(meta, w, m, mini_epoch_idx=mini, epoch=1)
        r_ = len(old[0])
        width = r_ * w
        expect = permute(n, 3, 1, np.arange(mini * width, (mini + 1) * width) % n)
        for consumed in sorted({0, 1, r_ // 2, r_ - 1, r_}):
            state = old[0].state_dict(consumed)
            assert all(ds.state_dict(consumed) == state for ds in old)  # every rank computes the same
            json.dumps(state)
            before = np.concatenate([ds.indices[:consumed] for ds in old])
            new = datasets(meta, w2, m)
            for ds in new:
                ds.load_state_dict(state)
            lengths = {len(ds) for ds in new}
            assert len(lengths) == 1  # equal per-rank lengths
            after = np.concatenate([ds.indices for ds in new])
            rest = width - consumed * w
            assert len(after) == -(-rest // w2) * w2
            # The union is the whole mini-epoch, each position once, plus the padding, which wraps
            # to the start of what was left.
            pad = len(after) - rest
            start = mini * width + consumed * w
            padding = permute(n, 3, 1, (start + np.arange(pad) % max(rest, 1)) % n) if pad else np.empty(0, int)
            got = np.concatenate([before, after])
            assert np.array_equal(np.sort(got), np.sort(np.concatenate([expect, padding])))
            if w2 == w:
                for ds, o in zip(new, old):
                    assert np.array_equal(ds.indices, o.indices[consumed:])


@pytest.mark.parametrize(("n", "w", "w2", "m"), [(101, 4, 3, 3), (50, 2, 5, 2), (20, 3, 3, 4)])
def test_rest_of_the_epoch_keeps_the_old_boundaries(write_meta, n: int, w: int, w2: int, m: int) -> None:
    meta = write_meta(n=n)
    old = datasets(meta, w, m, mini_epoch_idx=1, epoch=2)
    r_ = len(old[0])
    consumed = r_ // 2
    seen = [np.concatenate([ds.indices for ds in datasets(meta, w, m, mini_epoch_idx=0, epoch=2)])]
    seen.append(np.concatenate([ds.indices[:consumed] for ds in old]))
    new = datasets(meta, w2, m)
    for ds in new:
        ds.load_state_dict(old[0].state_dict(consumed))
    seen.append(np.concatenate([ds.indices for ds in new]))
    for mini in range(2, m):
        for ds in new:
            ds.set_epoch(2, mini)
        assert len({len(ds) for ds in new}) == 1
        seen.append(np.concatenate([ds.indices for ds in new]))
    got = np.concatenate(seen)
    # the whole epoch exactly once plus padding: every sample at least once, the excess is the
    # plan's own padding (T - N) plus the wrap-around padding of spreading over W2 ranks
    counts = np.bincount(got, minlength=n)
    assert counts.min() >= 1
    old_pad = r_ * w * m - n
    spread_pad = sum(-(-(r_ * w) // w2) * w2 - r_ * w for _ in range(2, m)) + (
        -(-(r_ - consumed) * w // w2) * w2 - (r_ - consumed) * w
    )
    assert counts.sum() - n == old_pad + spread_pad
    # the next epoch is planned afresh for the new world size
    for ds in new:
        ds.set_epoch(3, 0)
    fresh = [ShardSpec(n, w2, r, mini_epoch=m, seed=3, epoch=3).indices() for r in range(w2)]
    assert all(np.array_equal(ds.indices, f) for ds, f in zip(new, fresh))


def test_chained_resume(write_meta) -> None:
    meta = write_meta(n=97)
    first = datasets(meta, 4, 1)
    second = datasets(meta, 3, 1)
    for ds in second:
        ds.load_state_dict(first[0].state_dict(5))
    third = datasets(meta, 2, 1)
    for ds in third:
        ds.load_state_dict(second[0].state_dict(4))
    got = np.concatenate(
        [*(ds.indices[:5] for ds in first), *(ds.indices[:4] for ds in second), *(ds.indices for ds in third)]
    )
    assert set(got.tolist()) == set(range(97))


def test_errors(write_meta) -> None:
    meta, other = write_meta(n=30), write_meta(n=31)
    ds = datasets(meta, 2, 1)[0]
    with pytest.raises(ValueError, match=r"consumed must be in \[0, 15\]"):
        ds.state_dict(16)
    with pytest.raises(ValueError, match="consumed must be >= 0"):
        ds.state_dict(-1)
    state = ds.state_dict(3)
    with pytest.raises(ValueError, match="for 30 samples, but these meta files hold 31"):
        datasets(other, 2, 1)[0].load_state_dict(state)
    same_size = write_meta([f"other_{i}" for i in range(30)])
    with pytest.raises(ValueError, match="for other meta files: fingerprint"):
        datasets(same_size, 2, 1)[0].load_state_dict(state)
    with pytest.raises(ValueError, match="resume state version 99 is unknown"):
        ds.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="missing consumed_positions"):
        ds.load_state_dict({k: v for k, v in state.items() if k != "consumed_positions"})
    with pytest.raises(ValueError, match="eval"):
        RankDataset(meta, is_test=True, rank=0, world_size=1).state_dict(0)
    assert ds.state_dict() == {}
    ds.load_state_dict({})  # what StatefulDataLoader hands a dataset: nothing to do


def test_fingerprint_is_of_contents_not_paths(write_meta, tmp_path: Path) -> None:
    from rank_dataset import MetaFile

    a = write_meta(n=100)
    b = tmp_path / "copy.txt"
    b.write_bytes(a.read_bytes())
    assert MetaFile(a).fingerprint == MetaFile(b).fingerprint
    assert MetaFile([a, b]).fingerprint != MetaFile(a).fingerprint


def test_stateful_dataloader_same_and_other_world(write_meta) -> None:
    meta = write_meta(n=2000)
    ds = RankDataset(meta, reload_cfg={"seed": 5, "mini_epoch": 2}, rank=1, world_size=4)
    loader = StatefulDataLoader(ds, batch_size=20, sampler=ResumableSampler(ds), num_workers=2)
    got = []
    for k, batch in enumerate(loader):
        got += batch
        if k == 6:
            saved = json.loads(json.dumps(loader.state_dict()))
            break
    assert find_resume_state(saved)["consumed"] == 140
    # same world size: loading the loader state is enough
    ds2 = RankDataset(meta, reload_cfg={"seed": 5, "mini_epoch": 2}, rank=1, world_size=4)
    loader2 = StatefulDataLoader(ds2, batch_size=20, sampler=ResumableSampler(ds2), num_workers=2)
    loader2.load_state_dict(saved)
    assert got + [x for b in loader2 for x in b] == [ds.meta[int(i)] for i in ds.indices]
    # another world size: the dataset takes the resume point before the loader is built
    ds3 = RankDataset(meta, rank=0, world_size=3)
    ds3.load_state_dict(find_resume_state(saved))
    loader3 = StatefulDataLoader(ds3, batch_size=20, sampler=ResumableSampler(ds3), num_workers=2)
    loader3.load_state_dict(saved)
    assert [x for b in loader3 for x in b] == [ds3.meta[int(i)] for i in ds3.indices]
    with pytest.raises(ValueError, match="taken on 4 ranks and this job has 3"):
        ResumableSampler(
            RankDataset(meta, reload_cfg={"seed": 5, "mini_epoch": 2}, rank=0, world_size=3)
        ).load_state_dict(find_resume_state(saved))
    with pytest.raises(ValueError, match="no rank_dataset resume state"):
        find_resume_state({"x": 1})


@pytest.mark.slow  # a real server, one pass linger a request
def test_server_dataset_resumes_the_same(write_meta, start_server) -> None:
    from rank_dataset import RankServerDataset

    meta = write_meta(n=303)
    server = start_server([meta])
    old = RankDataset(meta, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=0, world_size=4)
    state = old.state_dict(10)
    for r in range(3):
        local = RankDataset(meta, rank=r, world_size=3)
        remote = RankServerDataset(server.url, rank=r, world_size=3)
        local.load_state_dict(state)
        remote.load_state_dict(state)
        assert np.array_equal(local.indices, remote.indices)
        local.set_epoch(0, 1)
        remote.set_epoch(0, 1)
        assert np.array_equal(local.indices, remote.indices)
    other = write_meta([f"x{i}" for i in range(303)])
    with pytest.raises(ValueError, match="other meta files"):
        RankServerDataset(start_server([other]).url, rank=0, world_size=1).load_state_dict(state)


def test_mix_record_round_trips_and_is_range_checked() -> None:
    from rank_dataset.plan.resume import MixRecord, ResumeState, SourceRecord

    mix = MixRecord(12, (SourceRecord("a", 10, "f" * 32, 9), SourceRecord("b", 3, None, 3)))
    state = ResumeState(12, None, 0, 1, 2, 1, 4, 3, mix=mix)
    as_dict = json.loads(json.dumps(state.to_dict()))
    assert as_dict["mix"] == {
        "epoch_size": 12,
        "sources": [
            {"name": "a", "num_samples": 10, "fingerprint": "f" * 32, "count": 9},
            {"name": "b", "num_samples": 3, "fingerprint": None, "count": 3},
        ],
    }
    assert ResumeState.from_dict(as_dict) == state
    renamed = MixRecord(12, (SourceRecord("x", 10, "f" * 32, 9), SourceRecord("y", 3, None, 3)))
    assert state.same_shard(ResumeState(12, None, 0, 1, 2, 1, 4, 0, mix=renamed))
    recounted = MixRecord(12, (SourceRecord("a", 10, "f" * 32, 8), SourceRecord("b", 3, None, 4)))
    assert not state.same_shard(ResumeState(12, None, 0, 1, 2, 1, 4, 0, mix=recounted))
    plain = ResumeState(12, None, 0, 1, 2, 1, 4, 3)
    assert "mix" not in plain.to_dict() and ResumeState.from_dict(plain.to_dict()) == plain
    bad_sources = [
        ({"epoch_size": 12, "sources": []}, ValueError, "non-empty"),
        ({"epoch_size": 13, "sources": as_dict["mix"]["sources"]}, ValueError, "sum of the counts, 12, got 13"),
        ({"epoch_size": 12}, ValueError, "the keys epoch_size and sources"),
        ({"epoch_size": 12, "sources": [{"name": "a"}]}, ValueError, "mix source 0 must be a dict with the keys"),
        ({"epoch_size": 12, "sources": "ab"}, TypeError, "mix sources must be a list"),
        (
            {"epoch_size": 12, "sources": [{**as_dict["mix"]["sources"][0], "count": 0}, as_dict["mix"]["sources"][1]]},
            ValueError,
            "mix source 'a' count must be in \\[1, ",
        ),
    ]
    for value, error, message in bad_sources:
        with pytest.raises(error, match=f"invalid resume state: .*{message}"):
            ResumeState.from_dict({**as_dict, "mix": value})
    with pytest.raises(ValueError, match="num_samples of a mix's state must be its epoch_size 12, got 13"):
        ResumeState.from_dict({**as_dict, "num_samples": 13, "consumed_positions": 0})
    with pytest.raises(ValueError, match=r"consumed_positions must be in \[0, 8\]"):
        ResumeState.from_dict({**as_dict, "consumed_positions": 9})  # keeps the plan's range check


@pytest.mark.parametrize(
    ("key", "value", "error", "message"),
    [
        ("plan_world_size", 2**40, ValueError, "plan_world_size must be at most"),
        ("plan_world_size", 0, ValueError, "plan_world_size must be >= 1"),
        ("consumed_positions", -1, ValueError, "consumed_positions must be >= 0"),
        ("consumed_positions", 10**6, ValueError, r"consumed_positions must be in \[0, "),
        ("mini_epoch_idx", 5, ValueError, r"mini_epoch_idx must be in \[0, mini_epoch=2\)"),
        ("mini_epoch", 0, ValueError, r"mini_epoch must be in \[1, \d+\), got 0"),
        ("epoch", -3, ValueError, r"epoch must be in \[0, \d+\), got -3"),
        ("seed", 2**70, ValueError, "seed must be in"),
        ("seed", "7", TypeError, "seed must be an int"),
        ("consumed", -1, ValueError, r"consumed must be in \[0, \d+\), got -1"),
        ("world_size", 0, ValueError, "world_size must be >= 1"),
        ("fingerprint", 12, TypeError, "fingerprint must be a str"),
    ],
)
def test_a_bad_state_names_the_key_and_changes_nothing(write_meta, key: str, value, error, message: str) -> None:
    meta = write_meta(n=100)
    ds = RankDataset(meta, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=0, world_size=2)
    state = ds.state_dict(10)
    ds.set_epoch(3, 1)  # a dataset on another plan than the state's
    before = (ds.spec, ds.reload_cfg, ds.indices.copy())
    with pytest.raises(error, match=f"invalid resume state: {message}"):
        ds.load_state_dict({**state, key: value})
    assert (ds.spec, ds.reload_cfg) == before[:2] and np.array_equal(ds.indices, before[2])


def test_a_state_for_other_files_changes_nothing(write_meta) -> None:
    meta, other = write_meta(n=100), write_meta([f"o{i}" for i in range(100)])
    state = RankDataset(meta, reload_cfg={"seed": 9, "mini_epoch": 4}, rank=0, world_size=2).state_dict(3)
    ds = RankDataset(other, reload_cfg={"seed": 1}, rank=0, world_size=2)
    spec = ds.spec
    with pytest.raises(ValueError, match="other meta files"):
        ds.load_state_dict(state)
    assert ds.spec == spec and ds.reload_cfg.seed == 1 and ds.reload_cfg.mini_epoch == 1


# -- repeated augmentation ----------------------------------------------------------------------------


def aug_order(n: int, k: int, seed: int, epoch: int, t: int) -> np.ndarray:
    """The reference epoch order over ``t`` positions, O(N): draws e*D.. of the stream, k copies each."""
    d = -(-n // k)
    stream = np.concatenate([permute(n, seed, j, np.arange(n)) for j in range((epoch + 1) * d // n + 1)])
    return np.repeat(stream[epoch * d : (epoch + 1) * d], k)[:n][np.arange(t) % n]


@pytest.mark.parametrize(("n", "m"), [(101, 1), (96, 2), (1000, 3)])
def test_aug_repeats_resume_four_ranks_onto_three_mid_epoch(write_meta, n: int, m: int) -> None:
    meta = write_meta(n=n)
    old = datasets(meta, 4, m, mini_epoch_idx=m - 1, epoch=1, aug_repeats=2)
    r_ = len(old[0])
    width = r_ * 4
    order = aug_order(n, 2, 3, 1, width * m)
    for ds, r in zip(old, range(4)):  # the layout: the reference order at the plain positions
        assert np.array_equal(ds.indices, order[(m - 1) * width + r + np.arange(r_) * 4])
    consumed = r_ // 2
    state = old[0].state_dict(consumed)
    assert state["aug_repeats"] == 2 and all(ds.state_dict(consumed) == state for ds in old)
    new = datasets(meta, 3, m, aug_repeats=2)
    for ds in new:
        ds.load_state_dict(json.loads(json.dumps(state)))
    before = np.concatenate([ds.indices[:consumed] for ds in old])
    after = np.concatenate([ds.indices for ds in new])
    rest = width - consumed * 4
    assert {len(ds) for ds in new} == {-(-rest // 3)}
    start = (m - 1) * width + consumed * 4
    padding = order[start + np.arange(len(after) - rest) % rest]
    expect = np.concatenate([order[(m - 1) * width : m * width], padding])
    assert np.array_equal(np.sort(np.concatenate([before, after])), np.sort(expect))
    # rank r of 3 reads the rest of the mini-epoch's positions r, r + 3, ... (wrapping within it)
    for r, ds in enumerate(new):
        positions = start + (r + 3 * np.arange(len(ds))) % rest
        assert np.array_equal(ds.indices, order[positions])
    # the next epoch plans afresh on 3 ranks, with k = 2
    for ds in new:
        ds.set_epoch(2)
    fresh = datasets(meta, 3, m, epoch=2, aug_repeats=2)
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(new, fresh))


def test_aug_repeats_resume_refuses_another_k(write_meta) -> None:
    meta = write_meta(n=100)
    state = datasets(meta, 4, 1, aug_repeats=2)[0].state_dict(5)
    for k in (1, 4):
        ds = datasets(meta, 2, 1, aug_repeats=k)[0]
        before = ds.indices.copy()
        with pytest.raises(ValueError, match=f"resume state is for aug_repeats=2, this dataset has aug_repeats={k}"):
            ds.load_state_dict(state)
        assert np.array_equal(ds.indices, before)  # the dataset is as it was
    plain = datasets(meta, 4, 1)[0].state_dict(5)
    assert plain["aug_repeats"] == 1
    old_format = {key: v for key, v in plain.items() if key != "aug_repeats"}  # a state written before aug_repeats
    with pytest.raises(ValueError, match="resume state is for aug_repeats=1, this dataset has aug_repeats=2"):
        datasets(meta, 2, 1, aug_repeats=2)[0].load_state_dict(old_format)
    ds = datasets(meta, 2, 1)[0]
    ds.load_state_dict(old_format)
    with pytest.raises(ValueError, match="invalid resume state: aug_repeats must be in"):
        ds.load_state_dict({**state, "aug_repeats": 0})


@pytest.mark.slow  # a real server and DataLoader workers
def test_aug_repeats_stateful_dataloader_and_server(write_meta, start_server) -> None:
    from rank_dataset import RankServerDataset

    meta = write_meta(n=500)
    cfg = {"seed": 5, "mini_epoch": 2, "aug_repeats": 2}
    ds = RankDataset(meta, reload_cfg=cfg, rank=1, world_size=4)
    loader = StatefulDataLoader(ds, batch_size=10, sampler=ResumableSampler(ds), num_workers=2)
    for step, _ in enumerate(loader):
        if step == 3:
            saved = json.loads(json.dumps(loader.state_dict()))
            break
    server = start_server([meta])
    for r in range(3):
        local = RankDataset(meta, reload_cfg=cfg, rank=r, world_size=3)
        remote = RankServerDataset(server.url, reload_cfg=cfg, rank=r, world_size=3)
        local.load_state_dict(find_resume_state(saved))
        remote.load_state_dict(find_resume_state(saved))
        assert np.array_equal(local.indices, remote.indices)
        loader = StatefulDataLoader(local, batch_size=10, sampler=ResumableSampler(local), num_workers=2)
        assert [x for b in loader for x in b] == [local.meta[int(i)] for i in local.indices]
        local.set_epoch(1, 1)
        remote.set_epoch(1, 1)
        assert np.array_equal(local.indices, remote.indices)


# -- schedules in the resume state ----------------------------------------------------------------------


def test_a_mix_record_holds_the_schedule_and_allows_changes_only_after_its_epoch() -> None:
    from rank_dataset.plan.resume import MixRecord, ResumeState, SourceRecord

    def record(changes: Any, names: tuple[str, str] = ("a", "b")) -> MixRecord:
        return MixRecord(12, (SourceRecord(names[0], 10, "f" * 32, 9), SourceRecord(names[1], 3, None, 3)), changes)

    saved = record(((3, (6, 6)), (7, (4, 8))))
    as_dict = json.loads(json.dumps(saved.to_dict()))
    assert as_dict["changes"] == [[3, [6, 6]], [7, [4, 8]]] and MixRecord.from_dict(as_dict) == saved
    assert "changes" not in record(()).to_dict()
    # the state's epoch is 5: the counts of epochs 0..5 must match, later ones may differ
    for ok in [((3, (6, 6)),), ((3, (6, 6)), (6, (2, 10))), ((3, (6, 6)), (7, (4, 8)), (9, (5, 7)))]:
        saved.check(record(ok), epoch=5)
        saved.check(record(ok, names=("x", "y")), epoch=5)  # renamed sources are the same sources
    both = "source 0 'a' has count {}, the state's has {}; source 1 'b' has count {}, the state's has {}, at epoch {}"
    bad = [
        ((), both.format(9, 6, 3, 6, 3)),
        (((3, (7, 5)),), both.format(7, 6, 5, 6, 3)),
        (((4, (6, 6)),), both.format(9, 6, 3, 6, 3)),
        (((3, (6, 6)), (5, (5, 7))), both.format(5, 6, 7, 6, 5)),
        (((2, (6, 6)),), both.format(6, 9, 6, 3, 2)),
    ]
    for changes, message in bad:
        with pytest.raises(ValueError, match=f"another mix: {re.escape(message)} .*only after the state's epoch 5"):
            saved.check(record(changes), epoch=5)
    state = ResumeState(12, None, 0, 5, 2, 1, 4, 3, mix=saved)
    assert ResumeState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert state.same_shard(ResumeState(12, None, 0, 5, 2, 1, 4, 0, mix=record(((3, (6, 6)), (6, (2, 10))))))
    assert not state.same_shard(ResumeState(12, None, 0, 5, 2, 1, 4, 0, mix=record(((3, (6, 6)), (5, (2, 10))))))
    with pytest.raises(ValueError, match=r"invalid resume state: changes\[0\] first epoch must be >= 1"):
        ResumeState.from_dict({**state.to_dict(), "mix": {**as_dict, "changes": [[0, [6, 6]]]}})
    with pytest.raises(ValueError, match=r"invalid resume state: changes\[0\] counts must be 2 counts summing to"):
        ResumeState.from_dict({**state.to_dict(), "mix": {**as_dict, "changes": [[3, [6, 7]]]}})
    with pytest.raises(TypeError, match=r"invalid resume state: mix changes must be a list"):
        ResumeState.from_dict({**state.to_dict(), "mix": {**as_dict, "changes": "3"}})
