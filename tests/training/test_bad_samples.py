"""Bad samples: exclude= (the complement of ids=), ids_of, and items whose transform fails, replaced
deterministically (on_error="replace"), recorded, counted against max_failures and left out of later epochs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from failures_worker import is_bad, load  # importable by spawn and forkserver workers (tests/ is on the path)
from rank_dataset import RandomSampler, RankDataset, RankServerDataset, Source, TooManyFailuresError, ids_of
from rank_dataset.plan.exclude import Exclusion, KeptIds
from rank_dataset.plan.permutation import permute
from rank_dataset.plan.subsets import SampleIds
from tests_helpers import rank_results, run_ranks, worker_env

N = 240


def sample_of(line: str) -> int:
    return int(line.split("_", 1)[1].split(".", 1)[0])


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i}.JPEG {i % 10}\n" for i in range(N)))
    return path


# -- exclude ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, m", [(1, 0), (10, 9), (1000, 1), (1000, 500), (100_003, 4_000)])
def test_kept_ids_select_the_complement(n: int, m: int) -> None:
    rng = np.random.default_rng(n + m)
    excluded = rng.choice(n, m, replace=False)
    kept = KeptIds(None, Exclusion.of(np.concatenate([excluded, excluded[: m // 2]]), "exclude"))  # repeats too
    kept.check(n, "s")
    reference = np.setdiff1d(np.arange(n), excluded)  # the O(N) reference
    assert len(kept) == reference.size
    k = rng.permutation(reference.size)
    assert np.array_equal(kept.take(k), reference[k])


def test_kept_ids_over_listed_ids_leave_out_the_excluded_values() -> None:
    ids = SampleIds.of(np.array([9, 4, 7, 1, 8]), "s")
    kept = KeptIds(ids, Exclusion.of([7, 8, 100 - 99], "exclude"))
    kept.check(10, "s")
    assert kept.take(np.arange(len(kept))).tolist() == [9, 4]


def test_exclude_is_checked_with_messages_naming_it(meta: Path) -> None:
    with pytest.raises(ValueError, match="past the last sample"):
        RankDataset(meta, exclude=[N])
    with pytest.raises(ValueError, match="negative"):
        RankDataset(meta, exclude=[-1])
    with pytest.raises(ValueError, match="leaves none"):
        RankDataset(meta, exclude=range(N))
    with pytest.raises(TypeError, match="exclude must be"):
        RankDataset(meta, exclude=3)
    with pytest.raises(ValueError, match=r"exclude must be a 1-D array of integers, got .* float64"):
        RankDataset(meta, exclude=[1.5, 2])  # refused, not truncated to sample 1
    assert Exclusion.of({3, 1}, "exclude") == Exclusion.of([1, 3], "exclude")  # a set: order does not matter


@pytest.mark.parametrize("world, mini", [(1, 1), (3, 2), (4, 1)])
def test_exclude_covers_every_kept_sample_once_per_epoch(meta: Path, tmp_path: Path, world: int, mini: int) -> None:
    excluded = np.array([0, 5, 17, 18, 19, 100, 239])
    np.save(tmp_path / "bad.npy", excluded)
    kept = np.setdiff1d(np.arange(N), excluded)  # the O(N) reference
    k = kept.size
    r_ = -(-k // (world * mini))
    for epoch in range(2):
        order = kept[permute(k, 3, epoch, np.arange(r_ * world * mini) % k)]
        seen = []
        for m in range(mini):
            for rank in range(world):
                cfg = {"seed": 3, "epoch": epoch, "mini_epoch": mini, "mini_epoch_idx": m}
                ds = RankDataset(meta, reload_cfg=cfg, rank=rank, world_size=world, exclude=tmp_path / "bad.npy")
                assert len(ds) == r_
                assert ds.indices.tolist() == order[m * r_ * world + rank + np.arange(r_) * world].tolist()
                assert [sample_of(ds[i]) for i in range(len(ds))] == ds.indices.tolist()
                seen += ds.indices.tolist()
        counts = np.bincount(seen, minlength=N)
        assert counts[excluded].sum() == 0 and counts[kept].min() == 1
        assert counts.sum() - k == r_ * world * mini - k  # only the padding repeats


def test_exclude_resumes_on_another_world_size(meta: Path) -> None:
    cfg = {"seed": 1, "mini_epoch": 2}
    old = [RankDataset(meta, reload_cfg=cfg, rank=r, world_size=4, exclude=[3, 4, 5]) for r in range(4)]
    state = old[0].state_dict(consumed=10)
    assert all(ds.state_dict(consumed=10) == state for ds in old)
    consumed = {int(i) for ds in old for i in ds.indices[:10]}
    rest = []
    for r in range(3):
        new = RankDataset(meta, reload_cfg=cfg, rank=r, world_size=3, exclude=[3, 4, 5])
        new.load_state_dict(state)
        rest += new.indices.tolist()
    planned = {int(i) for ds in old for i in ds.indices}
    assert planned - consumed <= set(rest) <= planned
    with pytest.raises(ValueError, match="other meta files"):  # another exclusion is another plan
        RankDataset(meta, reload_cfg=cfg, rank=0, world_size=3, exclude=[3, 4, 6]).load_state_dict(state)
    with pytest.raises(ValueError, match="237 samples"):
        RankDataset(meta, reload_cfg=cfg, rank=0, world_size=3, exclude=[3, 4]).load_state_dict(state)


def test_a_resume_into_another_exclude_names_the_exclusion(meta: Path) -> None:
    saved = RankDataset(meta, reload_cfg={"seed": 1}, rank=0, world_size=2).state_dict(consumed=5)  # all 240
    with pytest.raises(ValueError) as info:
        RankDataset(meta, reload_cfg={"seed": 1}, rank=0, world_size=2, exclude=[7]).load_state_dict(saved)
    message = str(info.value)
    assert (
        "is for 240 samples, but this dataset plans 239: its meta files hold 240, of which it leaves 1 out" in message
    )
    assert "build it with the exclude= of the run that saved the state" in message
    excluded = RankDataset(meta, reload_cfg={"seed": 1}, rank=0, world_size=2, exclude=[7]).state_dict(consumed=5)
    with pytest.raises(ValueError, match=r"hold 240 \(if the run that saved it left 1 samples out with exclude="):
        RankDataset(meta, reload_cfg={"seed": 1}, rank=0, world_size=2).load_state_dict(excluded)


def test_exclude_of_paths_points_to_ids_of(meta: Path) -> None:
    with pytest.raises(ValueError, match=r"look like paths, .* rank_dataset\.ids_of\(meta_file, paths\)"):
        RankDataset(meta, exclude=["train/a.jpg"])
    with pytest.raises(ValueError, match=r"not a readable \.npy .*; for paths of samples, use rank_dataset\.ids_of"):
        RankDataset(meta, exclude="train/a.jpg")
    assert RankDataset(meta, exclude=ids_of(meta, ["img_3.JPEG"])).num_samples == N  # the way to do it


def test_source_exclude_is_the_complement_of_ids(meta: Path) -> None:
    excluded = [1, 2, 50, 51, 52, 200]
    listed = np.setdiff1d(np.arange(N), excluded)
    cfg = {"seed": 9, "epoch": 2}
    a = RankDataset([Source(meta, exclude=excluded, weight=1), Source(meta, ids=[7, 8, 9], repeat=2)], reload_cfg=cfg)
    b = RankDataset([Source(meta, ids=listed, weight=1), Source(meta, ids=[7, 8, 9], repeat=2)], reload_cfg=cfg)
    assert a.indices.tolist() == b.indices.tolist()
    assert not set(a.indices.tolist()) & set(excluded)
    # exclude= on a mix: sample numbers over the distinct files, split among the sources
    c = RankDataset([Source(meta, weight=1), Source(meta, ids=[7, 8, 9], repeat=2)], reload_cfg=cfg, exclude=[8])
    assert 8 not in c.indices.tolist() and len(c) == (N - 1) + 2  # the default epoch: every sample of the sources
    assert pickle.loads(pickle.dumps(Source(meta, exclude=excluded))).exclude == Exclusion.of(excluded, "e")


def test_ids_of_finds_paths_and_names_the_missing(meta: Path) -> None:
    assert ids_of(meta, ["img_7.JPEG", "img_3.JPEG"]).tolist() == [3, 7]
    assert ids_of(meta, ["img_7.JPEG", "img_3.JPEG"]).tolist() == [3, 7]  # from the cache
    assert ids_of(meta, [1, 2], key=lambda line: int(line.split()[1])).tolist() == [
        i for i in range(N) if i % 10 in (1, 2)
    ]
    with pytest.raises(KeyError, match=r"'nope\.jpg'"):
        ids_of(meta, ["img_7.JPEG", "nope.jpg"])
    with pytest.warns(UserWarning, match="1 of 2 keys"):
        assert ids_of(meta, ["img_7.JPEG", "nope.jpg"], missing="warn").tolist() == [7]
    calls = []

    def label(line: str) -> int:
        calls.append(line)
        return int(line.split()[1])

    for _ in range(2):  # cached like group_by: the second call reads the cache, not the lines
        assert ids_of(meta, [4], key=label, cache_name="bs_label").tolist() == list(range(4, N, 10))
    assert len(calls) == N


# -- replacing items that fail ---------------------------------------------------------------------


def items_of(ds: RankDataset, **loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in DataLoader(ds, batch_size=8, **loader)]


@pytest.mark.parametrize("method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_replaced_items_keep_the_step_count_and_are_recorded(meta: Path, method: str) -> None:
    ds = RankDataset(
        meta, reload_cfg={"seed": 2}, parser="label", transform=load, on_error="replace", max_failures=None
    )
    steps = items_of(ds, num_workers=2, multiprocessing_context=method)
    assert len(steps) == -(-N // 8) and sum(map(len, steps)) == N
    items = [x for batch in steps for x in batch]
    bad = {i for i in range(N) if is_bad(i)}
    assert not set(items) & bad
    planned = ds.indices.tolist()
    assert [x for x, p in zip(items, planned) if not is_bad(p)] == [p for p in planned if not is_bad(p)]
    failures = ds.failures
    assert {f.sample for f in failures} == bad
    f = next(f for f in failures if f.sample == 20)
    assert f.where.endswith("meta.txt:21") and f.error == "OSError: image file is truncated (sample 20)"
    again = RankDataset(
        meta, reload_cfg={"seed": 2}, parser="label", transform=load, on_error="replace", max_failures=None
    )
    assert items_of(again, num_workers=2, multiprocessing_context=method) == steps  # the same run: the same items
    assert ds.audit() == ()  # no sampler of ours: no pass audited, nothing to complain about


def test_a_replan_that_fails_leaves_the_dataset_as_it_was(tmp_path: Path) -> None:
    # Source a takes repeat=0.3 of its 2 samples an epoch (0.6, so 1), both failing: leaving the one
    # that failed out of epoch 1 leaves 1 (0.3, so 0), which the mix refuses, after the reader has been
    # given the new exclusion. The dataset must then plan exactly as before, its reader included.
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("img_3.JPEG 0\nimg_20.JPEG 0\n")  # is_bad(3), is_bad(20)
    b.write_text("".join(f"img_{i}.JPEG 0\n" for i in range(110, 117)))  # none bad
    sources = [Source(a, repeat=0.3), Source(b, weight=1)]
    ds = RankDataset(
        sources, parser="label", transform=load, on_error="replace", max_failures=None, exclude_failures=True
    )
    before = ds.indices.tolist()
    items = [ds[i] for i in range(len(ds))]
    assert len({f.sample for f in ds.failures} & {0, 1}) == 1
    with pytest.raises(ValueError, match=r"source 'a\.txt': repeat=0\.3 of its 1 samples rounds to 0"):
        ds.set_epoch(1)
    assert ds.excluded_failures == () and ds.indices.tolist() == before
    ds.set_epoch(0)  # the plan of epoch 0 again, read through the reader as it was
    assert ds.indices.tolist() == before and [ds[i] for i in range(len(ds))] == items


def test_failure_records_past_a_readers_ring_are_counted_and_said(tmp_path: Path) -> None:
    from rank_dataset.shards.failures import CAPACITY

    path = tmp_path / "bad.txt"
    # Every other line fails (is_bad): more failures than a reader's ring holds, in one pass.
    numbers = [17 * i + (3 if i % 2 else 4) for i in range(2 * CAPACITY + 100)]
    path.write_text("".join(f"img_{k}.JPEG 0\n" for k in numbers))
    ds = RankDataset(path, parser="label", transform=load, on_error="replace", max_failures=None)
    items = [ds[i] for i in range(len(ds))]
    assert not any(is_bad(k) for k in items)
    with pytest.warns(RuntimeWarning, match=rf"failure records were lost .*more than {CAPACITY} failures"):
        recorded = ds.failures
    assert 0 < len(recorded) <= CAPACITY
    assert len(recorded) < sum(map(is_bad, numbers))  # what the warning is about


def test_persistent_workers_exclude_failures_from_the_next_epoch(meta: Path) -> None:
    ds = RankDataset(
        meta,
        reload_cfg={"seed": 2},
        parser="label",
        transform=load,
        on_error="replace",
        max_failures=None,
        exclude_failures=True,
    )
    sampler = RandomSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True)
    first = [x for batch in loader for x in batch.tolist()]
    bad = {i for i in range(N) if is_bad(i)}
    assert len(first) == N and not set(first) & bad
    assert ds.audit()[-1].read == N  # replaced items count as read
    ds.set_epoch(1)
    sampler.set_epoch(1)
    assert set(ds.excluded_failures) == bad and len(ds) == N - len(bad)
    second = [x for batch in loader for x in batch.tolist()]
    assert sorted(second) == sorted(set(range(N)) - bad)  # every kept sample once, none replaced
    state = ds.state_dict(consumed=3)
    assert state["excluded_failures"] == sorted(bad) and len(state["failures"]) == len(bad)
    fresh = RankDataset(meta, reload_cfg={"seed": 2}, parser="label", transform=load, on_error="replace")
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.indices.tolist() == ds.indices[3:].tolist()
    assert {f.sample for f in fresh.failures} == bad


def test_max_failures_raises_naming_the_samples(meta: Path) -> None:
    ds = RankDataset(meta, parser="label", transform=load, on_error="replace", max_failures=2)
    with pytest.raises(TooManyFailuresError, match=r"past max_failures=2: sample \d+ \(.*meta.txt:\d+\): OSError") as e:
        items_of(ds, num_workers=0)
    assert "exclude=[" in str(e.value)


def unmounted(parsed: tuple[str, int]) -> int:
    raise FileNotFoundError(f"/mnt/images/{parsed[0]}")


@pytest.mark.parametrize("max_failures", [5, None])
def test_every_substitute_failing_says_the_data_may_be_unreachable(meta: Path, max_failures: int | None) -> None:
    ds = RankDataset(meta, parser="label", transform=unmounted, on_error="replace", max_failures=max_failures)
    with pytest.raises(TooManyFailuresError, match="Every substitute tried failed too") as e:
        items_of(ds, num_workers=0)
    message = str(e.value)
    assert "the data itself may be unreachable" in message and "would not help" in message
    assert "exclude=[" not in message  # the advice that cannot help is not given
    assert "FileNotFoundError: /mnt/images/img_" in message


def test_state_dict_without_consumed_keeps_this_ranks_failures(meta: Path) -> None:
    kw: dict[str, Any] = {"parser": "label", "transform": load, "on_error": "replace", "max_failures": None}
    ds = RankDataset(meta, reload_cfg={"seed": 2}, **kw)
    assert ds.state_dict() == {}  # nothing failed yet
    items_of(ds, num_workers=0)
    bad = {i for i in range(N) if is_bad(i)}
    state = json.loads(json.dumps(ds.state_dict()))
    assert set(state) == {"failures"} and {f["sample"] for f in state["failures"]} == bad
    fresh = RankDataset(meta, reload_cfg={"seed": 2}, **kw)
    fresh.load_state_dict(state)
    assert {f.sample for f in fresh.failures} == bad
    assert fresh.indices.tolist() == ds.indices.tolist()  # no resume point: the shard is as it was
    assert RankDataset(meta, parser="label", transform=load).state_dict() == {}  # on_error="raise": no records


@pytest.mark.slow  # DataLoader workers that raise: torch's shutdown of them waits 5 s each
def test_max_failures_raises_from_a_worker(meta: Path) -> None:
    worker = RankDataset(meta, parser="label", transform=load, on_error="replace", max_failures=0.01)  # 2 of 240
    with pytest.raises(TooManyFailuresError, match="exclude_failures=True"):
        items_of(worker, num_workers=2)


def test_on_error_raise_and_arguments_are_checked(meta: Path) -> None:
    ds = RankDataset(meta, parser="label", transform=load, reload_cfg={"seed": 0})
    bad = next(i for i, s in enumerate(ds.indices.tolist()) if is_bad(s))
    with pytest.raises(OSError, match="truncated"):
        ds[bad]
    with pytest.raises(ValueError, match="on_error must be"):
        RankDataset(meta, on_error="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exclude_failures=True needs"):
        RankDataset(meta, exclude_failures=True)
    with pytest.raises(ValueError, match="fraction"):
        RankDataset(meta, on_error="replace", max_failures=1.5)
    with pytest.raises(TypeError, match="transform must be"):
        RankDataset(meta, transform=3)  # type: ignore[arg-type]


def test_the_meta_server_gives_the_same(meta: Path, start_server: Any) -> None:
    server = start_server([meta])
    other = meta.parent / "other.txt"
    other.write_text("".join(f"img_{i}.JPEG {i % 10}\n" for i in range(N, N + 50)))
    two = start_server([meta, other])
    kw: dict[str, Any] = {"reload_cfg": {"seed": 4, "mini_epoch": 2}, "parser": "label", "transform": load}
    kw.update(on_error="replace", max_failures=None, exclude_failures=True, rank=1, world_size=3)
    cases = [
        (RankDataset(meta, exclude=[0, 9, 10], **kw), RankServerDataset(server.url, exclude=[0, 9, 10], **kw)),
        (
            RankDataset([Source(meta, exclude=[4]), Source(other, weight=1)], exclude=[N + 1], **kw),
            RankServerDataset(two.url, sources=[Source("meta.txt", exclude=[4]), Source("other.txt", weight=1)],
                              exclude=[N + 1], **kw),
        ),
    ]  # fmt: skip
    for local, remote in cases:
        for epoch in range(2):
            local.set_epoch(epoch)
            remote.set_epoch(epoch)
            assert local.indices.tolist() == remote.indices.tolist()
            assert items_of(local, num_workers=2) == items_of(remote, num_workers=2)
        assert {f.sample for f in local.failures} == {f.sample for f in remote.failures} != set()
        assert local.excluded_failures == remote.excluded_failures


# -- two gloo ranks, two workers each ------------------------------------------------------------------


def run_job(meta: Path, work: Path, world: int, phase: str, method: str, tag: str) -> list[dict[str, Any]]:
    out = work / f"result_{tag}"
    proc = run_ranks("failures_worker.py", world, meta, out, phase, method, env=worker_env(), timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return rank_results(out, world)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    work = tmp_path_factory.mktemp("failures")
    meta = work / "meta.txt"
    meta.write_text("".join(f"img_{i}.JPEG {i % 10}\n" for i in range(N)))
    runs = {"a": run_job(meta, work, 2, "full", "fork", "a"), "b": run_job(meta, work, 2, "full", "forkserver", "b")}
    runs["same"] = run_job(meta, work, 2, "resume", "fork", "same")
    runs["other"] = run_job(meta, work, 1, "resume", "fork", "other")
    return runs


@pytest.mark.slow
@pytest.mark.longest  # the first test of the module's four torchrun jobs
def test_two_ranks_replace_failures_without_losing_step(jobs: dict[str, list[dict[str, Any]]]) -> None:
    a = jobs["a"]
    bad = {i for i in range(N) if is_bad(i)}
    for epoch, length in (("epoch0", N // 2), ("epoch1", (N - len(bad)) // 2)):
        for r in a:
            run = r[epoch]
            assert run["length"] == length and len(run["steps"]) == -(-length // 8)  # every rank: the same steps
            items = [x for batch in run["steps"] for x in batch]
            assert not set(items) & bad  # no failing sample's item, ever
            assert [x for x, p in zip(items, run["planned"]) if not is_bad(p)] == [
                p for p in run["planned"] if not is_bad(p)
            ]
            assert set(items) <= set(run["planned"])  # substitutes come from this rank's shard
    visited = [{p for p in r["epoch0"]["planned"] if is_bad(p)} for r in a]
    for r, mine in zip(a, visited):
        assert set(r["failures"]) >= mine and set(r["failures"]) <= bad  # its own, and failing substitutes
    assert all(set(r["excluded"]) == bad for r in a)  # all-gathered at set_epoch: both ranks plan the same
    assert jobs["b"] == a  # a second run (forkserver workers) gives identical items


@pytest.mark.slow
@pytest.mark.longest  # beside the test above, so that the module's jobs run once
def test_resume_mid_epoch_on_the_same_and_another_world_size(jobs: dict[str, list[dict[str, Any]]]) -> None:
    from failures_worker import BATCH, STEPS_BEFORE

    a, same, other = jobs["a"], jobs["same"], jobs["other"]
    skip = STEPS_BEFORE * BATCH
    for full, resumed in zip(a, same):  # the same world size: the same remaining items, substitutes included
        assert resumed["epoch0"]["planned"] == full["epoch0"]["planned"][skip:]
        assert [x for b in resumed["epoch0"]["steps"] for x in b] == [x for b in full["epoch0"]["steps"] for x in b][
            skip:
        ]
        assert resumed["epoch1"] == full["epoch1"]  # the failures before the checkpoint travelled in the state
    # one rank: what is left of the epoch holds the same samples, and epoch 1 is the same plan on one rank
    (solo,) = other
    left = sorted(p for r in a for p in r["epoch0"]["planned"][skip:])
    assert sorted(solo["epoch0"]["planned"]) == left
    items = [x for b in solo["epoch0"]["steps"] for x in b]
    assert [x for x, p in zip(items, solo["epoch0"]["planned"]) if not is_bad(p)] == [
        p for p in solo["epoch0"]["planned"] if not is_bad(p)
    ]
    assert not {x for x in items if is_bad(x)}
    interleaved = [p for pair in zip(a[0]["epoch1"]["planned"], a[1]["epoch1"]["planned"]) for p in pair]
    assert solo["epoch1"]["planned"] == interleaved
    assert [x for b in solo["epoch1"]["steps"] for x in b] == interleaved
