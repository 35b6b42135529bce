"""What a run trained on: manifests, samples_of against what DataLoaders yielded, skipped step ranges resumed on
other world sizes, and the ``rank-dataset samples`` command on a real manifest (ranks in one process)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import MetaFileChangedError, RankDataset, Source, StepSampler, samples_of
from tests_helpers import BLOCK_TORCH

pytestmark = pytest.mark.filterwarnings("error::rank_dataset.PassAuditWarning")  # a skip must keep the audit exact

N, OTHER = 37, 11
CFG = {"mini_epoch": 3, "seed": 5}
SCHEDULE = {0: 4, 3: 8, 6: 16}


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    meta, other = tmp_path / "meta.txt", tmp_path / "other.txt"
    meta.write_text("".join(f"img_{i}.jpg {i % 3}\n" for i in range(N)))
    other.write_text("".join(f"doc_{i}.txt {i}\n" for i in range(OTHER)))
    return meta, other


def make(kind: str, files: tuple[Path, Path], rank: int, world: int) -> RankDataset:
    meta, other = (str(p) for p in files)
    if kind == "mix":  # subsets (ids), a source's exclude and exclude= over the mix
        sources = [
            Source(meta, ids=np.arange(0, N, 2), exclude=[4, 8], weight=2, name="even"),
            Source(other, repeat=2, name="docs"),
        ]
        cfg = {**CFG, "epoch_size": 40}
        return RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=world, exclude=[N + 3])
    if kind == "stepmix":  # rules by step and repeated augmentation
        sources = [Source(meta, weight={0: 1, 5: 3}, by="step"), Source(other, choose={0: 6, 8: 20}, by="step")]
        return RankDataset(sources, reload_cfg={**CFG, "epoch_size": 40, "aug_repeats": 2}, rank=rank, world_size=world)
    if kind == "exclude":
        return RankDataset(meta, reload_cfg=CFG, rank=rank, world_size=world, exclude=np.array([1, 5, 30]))
    return RankDataset(meta, reload_cfg=CFG, rank=rank, world_size=world)


def check_rows(rows: list[dict[str, Any]], files: tuple[Path, Path]) -> None:
    """Each row's sample number, file and line agree with the files' contents (line i of a file names i)."""
    for row in rows:
        if row["file"] == str(files[0].resolve()):
            assert row["line"] == f"img_{row['sample']}.jpg {row['sample'] % 3}"
        else:
            assert row["file"] == str(files[1].resolve())
            assert row["line"] == f"doc_{row['sample'] - N}.txt {row['sample'] - N}"


@pytest.mark.parametrize("kind", ["plain", "exclude", "mix", "stepmix", "buckets", "budget"])
def test_samples_of_is_what_the_loader_yielded(files: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    steps, skip = 14, [(2, 4), (9, 10)]
    ds = make(kind if kind not in ("buckets", "budget") else "plain", files, 0, 1)
    cost = (np.arange(N) * 7) % 11 + 1
    if kind == "buckets":
        sampler = StepSampler(ds, 6, bucket_by=np.arange(N) % 3, skip=skip)
    elif kind == "budget":
        sampler = StepSampler(ds, None, max_cost=30, cost=cost, skip=skip)
    else:
        sampler = StepSampler(ds, SCHEDULE, skip=skip)
    path = tmp_path / "run.json"
    manifest = sampler.manifest(path)
    assert json.loads(path.read_text()) == manifest
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=2)
    batches = [b for _, b in zip(range(steps), loader)]
    del loader
    for t in range(steps):
        rows = samples_of(path, step=t)
        assert [r["line"] for r in rows] == batches[t]
        check_rows(rows, files)
        if kind in ("mix", "stepmix"):
            names = {"even", "docs"} if kind == "mix" else {"meta.txt", "other.txt"}
            assert {r["source"] for r in rows} <= names
            assert all((r["source"] in ("docs", "other.txt")) == (r["sample"] >= N) for r in rows)
        else:
            assert {r["source"] for r in rows} == {None}
    # A skipped data batch is queried by batch=, and says so; a kept one is a loop step's.
    skipped = samples_of(path, batch=3)
    assert skipped and all(r["skipped"] for r in skipped)
    assert [r["line"] for r in samples_of(path, batch=4)] == batches[2]
    assert not any(r["skipped"] for r in samples_of(path, batch=4))
    if kind == "mix":  # what exclude= and a source's exclude leave out is never there
        seen = {r["sample"] for t in range(steps) for r in samples_of(path, step=t)}
        assert not seen & {4, 8, N + 3} and all(s >= N or s % 2 == 0 for s in seen)


def run_ranks_inline(
    kind: str, files: tuple[Path, Path], world: int, first: int, stop: int, *, skip: Any, state: Any, live: Any
) -> tuple[list[list[str]], dict[str, Any]]:
    """Loop steps ``[first, stop)`` of ``world`` ranks (each a sampler with ``skip``, resumed from ``state``, and
    ``live = (loop step, first, stop)``: a run-time skip called at that loop step), concatenated in rank order; and
    the state at ``stop`` (the same on every rank)."""
    per_rank, states = [], []
    for r in range(world):
        ds = make(kind, files, r, world)
        sampler = StepSampler(ds, SCHEDULE, skip=skip)
        if state is not None:
            sampler.load_state_dict(state)
        assert sampler.step == first
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)  # no workers: no batch handed out early
        mine = []
        for step, batch in zip(range(first, stop), loader):
            mine.append(batch)
            if live is not None and step == live[0]:
                sampler.skip(live[1], live[2])
        per_rank.append(mine)
        states.append(sampler.state_dict(step=stop))
        del loader
    assert all(s == states[0] for s in states)
    return [[x for r in range(world) for x in per_rank[r][t]] for t in range(stop - first)], states[0]


@pytest.mark.parametrize("seed", range(4))
def test_random_skips_resumed_on_random_world_sizes(files: tuple[Path, Path], seed: int) -> None:
    rng = np.random.default_rng(seed)
    kind = ["plain", "mix", "stepmix", "plain"][seed]
    worlds = [1, 2, 4] if kind != "stepmix" else [1, 2]
    # The definition: data batch d of the run without skips; loop step L trains on the L-th kept data batch.
    reference, _ = run_ranks_inline(kind, files, 1, 0, 60, skip=None, state=None, live=None)
    cuts = np.sort(rng.choice(np.arange(1, 30), size=4, replace=False)).tolist()
    given, again = (cuts[0], cuts[1]), (cuts[2], cuts[3])  # at construction (the second also in phase 2)
    l1, l2 = int(rng.integers(4, 10)), int(rng.integers(14, 22))
    at = int(rng.integers(0, l1 - 1))
    ranges = [given, again]
    upcoming = _batch_of(ranges, at + 1)
    live = (at, upcoming + 2, upcoming + 2 + int(rng.integers(1, 4)))
    if any(a < live[2] and live[1] < b for a, b in ranges):  # a run-time skip that overlaps: not this seed's
        live = (at, max(b for _, b in ranges) + 1, max(b for _, b in ranges) + 3)
    w1, w2 = (int(w) for w in rng.choice(worlds, size=2))
    first, state = run_ranks_inline(kind, files, w1, 0, l1, skip=[given, again], state=None, live=live)
    assert state["skip"] == sorted([list(given), list(again), list(live[1:])])
    rest, _ = run_ranks_inline(kind, files, w2, l1, l2, skip=[again], state=state, live=None)
    skipped = {d for a, b in [given, again, live[1:]] for d in range(a, b)}
    kept = [d for d in range(len(reference)) if d not in skipped]
    assert first + rest == [reference[d] for d in kept[:l2]]
    # A state whose skips overlap the sampler's other ranges is refused; the same ranges count once.
    ds = make(kind, files, 0, 1)
    with pytest.raises(ValueError, match="overlaps the skipped range"):
        StepSampler(ds, SCHEDULE, skip=[(given[0], given[1] + 1)]).load_state_dict(state)


def _batch_of(ranges: list[tuple[int, int]], step: int) -> int:
    from rank_dataset.plan.skips import Skips

    return Skips.of(ranges).batch_of(step)


def test_run_time_skip_needs_batches_not_handed_out(files: tuple[Path, Path]) -> None:
    ds = make("plain", files, 0, 1)
    sampler = StepSampler(ds, SCHEDULE, skip=[(5, 8)])
    it = iter(sampler)
    for _ in range(6):  # loop steps 0..5: data batches 0..4 and 8
        batch = next(it)
        ds.__getitems__(batch)  # read, as a DataLoader would: the sampler changes shards once they are read
        assert len(batch) == sampler.global_batch_size(sampler.step - 1)
    assert sampler.step == 6 and sampler.skips.batch_of(6) == 9
    with pytest.raises(ValueError, match=r"data batches up to 8 have been handed out .* skip from data batch 9 on"):
        sampler.skip(8, 12)
    sampler.skip(5, 8)  # the same range again: counts once
    sampler.skip(9, 12)
    assert sampler.skips.to_list() == [[5, 8], [9, 12]] and sampler.skips.batch_of(6) == 12
    with pytest.raises(ValueError, match="overlaps"):
        sampler.skip(11, 20)
    it.close()


def keys_of(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in keys_of(v)}
    if isinstance(node, list):
        return {k for v in node for k in keys_of(v)}
    return set()


def test_manifest_names_no_rank(files: tuple[Path, Path], tmp_path: Path) -> None:
    for kind in ("plain", "mix", "stepmix"):
        found = []
        for r, w in ((0, 1), (1, 2), (3, 4)):
            ds = make(kind, files, r, w)
            sampler = StepSampler(ds, SCHEDULE if kind != "stepmix" else {0: 4, 3: 8}, skip=[(1, 2)])
            found.append((ds.manifest(tmp_path / "ds.json"), sampler.manifest(tmp_path / "run.json")))
        assert all(f == found[0] for f in found)
        assert not keys_of(found[0]) & {"rank", "world_size", "mini_epoch_idx", "epoch"}
    with pytest.raises(ValueError, match=r"depends on arrays \(exclude, source0.exclude, source0.ids\)"):
        make("mix", files, 0, 1).manifest()
    plain = make("plain", files, 0, 1).manifest()  # no array: a dict alone
    assert plain["steps"] is None and plain["reload_cfg"]["seed"] == 5 and len(plain["files"]) == 1


def test_a_changed_file_or_array_is_refused(files: tuple[Path, Path], tmp_path: Path) -> None:
    ds = make("mix", files, 0, 1)
    path = tmp_path / "run.json"
    StepSampler(ds, SCHEDULE).manifest(path)
    assert samples_of(path, step=0)
    ids = tmp_path / "run.source0.ids.npy"
    original = ids.read_bytes()
    np.save(ids, np.arange(1, N, 2))
    with pytest.raises(ValueError, match=r"manifest sources\[0\] ids: run.source0.ids.npy is not the array"):
        samples_of(path, step=0)
    ids.write_bytes(original)
    files[1].write_text("".join(f"doc_{i}.txt {i + 1}\n" for i in range(OTHER)))  # same count, other bytes
    with pytest.raises(MetaFileChangedError, match=r"other\.txt changed: .* the run's manifest recorded 11"):
        samples_of(path, step=0)


def test_epoch_layout_shards(files: tuple[Path, Path], tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    make("mix", files, 0, 1).manifest(path)
    world = 2
    for epoch in (0, 2):
        for mini in range(CFG["mini_epoch"]):
            for r in range(world):
                ds = make("mix", files, r, world)
                ds.set_epoch(epoch, mini)
                rows = samples_of(path, epoch=epoch, mini_epoch=mini, rank=r, world_size=world)
                assert [r["line"] for r in rows] == [ds[i] for i in range(len(ds))]
                assert [r["sample"] for r in rows] == ds.indices.tolist()
    with pytest.raises(ValueError, match="this manifest is a dataset's"):
        samples_of(path, step=0)
    with pytest.raises(ValueError, match="give one of step=, batch= and epoch=, got step and epoch"):
        samples_of(path, step=0, epoch=0)


def cli(*args: Any, blocked: bool = True) -> subprocess.CompletedProcess[str]:
    """``rank-dataset ARGS`` in a fresh interpreter, with torch blocked (the command needs none)."""
    code = (BLOCK_TORCH if blocked else "import sys\n") + (
        f"sys.argv = ['rank-dataset', *{[str(a) for a in args]!r}]\nfrom rank_dataset.cli import main\nmain()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_cli_on_a_manifest_file(files: tuple[Path, Path], tmp_path: Path) -> None:
    ds = make("mix", files, 0, 1)
    path = tmp_path / "run.json"
    StepSampler(ds, SCHEDULE, skip=[(1, 3)]).manifest(path)
    out = cli("samples", path, "--steps", "0:5")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    expected = [{"step": t, "batch": t if t < 1 else t + 2, **r} for t in range(5) for r in samples_of(path, step=t)]
    assert rows == expected
    out = cli("samples", path, "--step", "4", "--rank", "1", "--world-size", "2", "--format", "csv")
    assert out.returncode == 0, out.stderr
    table = list(csv.DictReader(io.StringIO(out.stdout)))
    mine = samples_of(path, step=4, rank=1, world_size=2)
    assert [r["line"] for r in table] == [r["line"] for r in mine] and len(mine) == 8  # data batch 6: 16 items
    assert {r["rank"] for r in table} == {"1"} and [int(r["sample"]) for r in table] == [r["sample"] for r in mine]
    out = cli("samples", path, "--batch", "2")
    assert out.returncode == 0, out.stderr
    assert all(json.loads(line)["skipped"] is True for line in out.stdout.splitlines())
    data = tmp_path / "data.json"
    ds.manifest(data)
    out = cli("samples", data, "--epoch", "1", "--mini-epoch", "2", "--rank", "0", "--world-size", "2")
    assert out.returncode == 0, out.stderr
    shard = samples_of(data, epoch=1, mini_epoch=2, rank=0, world_size=2)
    assert [json.loads(line)["line"] for line in out.stdout.splitlines()] == [r["line"] for r in shard]
    out = cli("samples", path, "--step", "1", "--batch", "2")
    assert out.returncode == 2 and "give one of --step, --steps, --batch and --epoch" in out.stderr
    files[0].write_text("".join(f"img_{i}.jpg {i % 3}\n" for i in range(N + 1)))  # a sample more
    out = cli("samples", path, "--step", "0")
    assert out.returncode == 1 and "meta.txt changed" in out.stderr


@pytest.mark.parametrize("kind", ["plain", "mix", "stepmix", "buckets"])
def test_a_far_step_is_planned_alone(files: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    # A step a replay of the run could never reach: samples_of plans its window alone, as a sampler started there
    # loads that window's shard alone.
    far = 10**12
    ds = make(kind if kind != "buckets" else "plain", files, 0, 1)
    if kind == "buckets":
        sampler = StepSampler(ds, 6, bucket_by=np.arange(N) % 3, start_step=far, skip=[(5, 9)])
    else:
        sampler = StepSampler(ds, SCHEDULE, start_step=far, skip=[(5, 9)])
    path = tmp_path / "run.json"
    sampler.manifest(path)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)
    batches = [b for _, b in zip(range(2), loader)]
    for t in range(2):
        rows = samples_of(path, step=far + t)
        assert [r["line"] for r in rows] == batches[t]
        check_rows(rows, files)


def test_a_run_time_skip_past_the_window_keeps_the_pass_audit_exact(files: tuple[Path, Path]) -> None:
    def loop(skip_at: int | None, steps: int) -> tuple[list[list[str]], Any]:
        ds = RankDataset(files[0], reload_cfg=CFG, rank=0, world_size=1, audit="error")
        sampler = StepSampler(ds, 4)  # 37 draws in 3 windows of 13: data batches 0-3 start in window 0
        batches = []
        for step, batch in zip(range(steps), DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)):
            batches.append(batch)
            if step == skip_at:  # the rest of window 0, and the first batch of window 1
                sampler.skip(1, 5)
        return batches, ds.audit()

    reference, _ = loop(None, 14)
    batches, audit = loop(0, 10)
    assert batches == reference[:1] + reference[5:14]
    assert len(audit) >= 3 and all(count.ok for count in audit if count.state == "finished")


def test_what_a_manifest_refuses(files: tuple[Path, Path], tmp_path: Path) -> None:
    meta = files[0]
    with pytest.raises(ValueError, match="a manifest describes a training stream: this dataset is an eval one"):
        RankDataset(meta, is_test=True, rank=0, world_size=1).manifest()
    failing = RankDataset(meta, rank=0, world_size=1, on_error="replace", exclude_failures=True)
    with pytest.raises(ValueError, match="exclude_failures=True changes the plan each epoch"):
        failing.manifest()
    manifest = make("plain", files, 0, 1).manifest()
    with pytest.raises(ValueError, match="invalid manifest: its files less exclude hold 37 samples, it plans 36"):
        samples_of({**manifest, "num_samples": 36}, epoch=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="rank= needs world_size="):
        samples_of(StepSampler(make("plain", files, 0, 1), 4).manifest(), step=0, rank=0)
    with pytest.raises(ValueError, match="not a multiple of the world size 3"):
        samples_of(StepSampler(make("plain", files, 0, 1), 4).manifest(), step=0, rank=0, world_size=3)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json is not a manifest: not JSON"):
        samples_of(tmp_path / "bad.json", step=0)
