"""StepSampler under torchrun (gloo): global batches the same on 2, 4 and 8 ranks, with both readers, and a
4-rank job stopped at a random step resumed on 2 and on 8 ranks."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from rank_dataset import StepSampler
from rank_dataset.plan.counts import batch_counts
from steps_worker import SCHEDULE, as_list, dataset
from tests_helpers import rank_results, run_ranks, worker_env

pytestmark = pytest.mark.slow  # torchrun jobs: not in make test-quick

STEPS = 16  # 8 to 32 samples a step over 100 (a mix of 120 or 150): windows, epochs and every schedule change crossed


@pytest.fixture
def files(tmp_path: Path) -> Path:
    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"img_{i}.jpg {i % 7}\n" for i in range(100)))
    (tmp_path / "other.txt").write_text("".join(f"doc_{i}.txt {i}\n" for i in range(13)))
    (tmp_path / "third.txt").write_text("".join(f"page_{i}.txt {i}\n" for i in range(40)))
    (tmp_path / "fourth.txt").write_text("".join(f"row_{i}.txt {i}\n" for i in range(20)))
    return meta


def reference(kind: str, meta: Path) -> list[list[str]]:
    """The uninterrupted run on one rank, in this process."""
    ds = dataset(kind, str(meta), "file") if kind != "plain" else _plain(meta)
    loader = DataLoader(ds, batch_sampler=StepSampler(ds, SCHEDULE), collate_fn=as_list)
    return [b for _, b in zip(range(STEPS), loader)]


def _plain(meta: Path) -> Any:
    from rank_dataset import RankDataset
    from steps_worker import CFG

    return RankDataset(meta, reload_cfg=CFG, rank=0, world_size=1)


def run_job(
    tmp_path: Path, name: str, world: int, kind: str, meta: Path, reader: str, first: int, last: int, state: str
) -> list[list[str]]:
    """Global batches ``[start, last)`` of a ``world``-rank job: the ranks' batches concatenated in rank order."""
    out = tmp_path / name
    proc = run_ranks(
        "steps_worker.py", world, kind, meta, reader, out, first, last, state, env=worker_env(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, world)
    assert all(r["world_size"] == world for r in results)
    steps = len(results[0]["batches"])
    assert all(len(r["batches"]) == steps for r in results)
    return [[x for r in results for x in r["batches"][t]] for t in range(steps)]


@pytest.mark.parametrize(
    ("reader", "kind", "world"),
    [
        ("file", "plain", 2),
        ("file", "mix", 4),
        ("collective", "plain", 4),
        ("collective", "mix", 2),
        ("file", "plain", 8),
        ("collective", "stepmix", 4),
        ("file", "stepmix", 2),
    ],
)
def test_global_batches_on_any_world_size(files: Path, tmp_path: Path, reader: str, kind: str, world: int) -> None:
    expected = reference(kind, files)
    assert run_job(tmp_path, "run", world, kind, files, reader, 0, STEPS, "-") == expected
    if kind == "stepmix":  # the reference's counts: each batch's draws apportioned by the rules at its step
        for t, batch in enumerate(expected):
            draws = batch[: len(batch) // 2]
            assert batch == draws + draws  # copy-major: with W >= 2 the two copies of a draw on two ranks
            fixed = [6 if t < 10 else 30, 40 if t < 5 else 20]
            w = 1 if t < 7 else 3
            left = 150 - sum(fixed)
            shares = [Fraction(left * w, w + 1), fixed[0], fixed[1], Fraction(left, w + 1)]
            counts = [sum(x.startswith(p) for x in draws) for p in ("img_", "doc_", "page_", "row_")]
            assert counts == batch_counts(len(draws), shares), t


def digest(batch: list[str]) -> str:
    return hashlib.sha256("\n".join(batch).encode()).hexdigest()


@pytest.mark.longest  # three jobs each: 4, 2 and 8 ranks
@pytest.mark.parametrize("kind", ["plain", "stepmix"])
def test_stop_on_four_ranks_resume_on_two_and_eight(files: Path, tmp_path: Path, kind: str) -> None:
    import random

    stop = random.Random().randrange(1, STEPS - 1)
    expected = reference(kind, files)
    state = tmp_path / "state.json"
    head = run_job(tmp_path, "head", 4, kind, files, "collective", 0, stop, str(state))
    assert len(head) == stop
    for world, reader in ((2, "file"), (8, "collective")):
        tail = run_job(tmp_path, f"tail{world}", world, kind, files, reader, 1, STEPS, str(state))
        got = head + tail
        # By hashing: each global batch of the interrupted run is the uninterrupted run's, none repeated or lost.
        assert [digest(b) for b in got] == [digest(b) for b in expected], (stop, world)
        assert sorted(x for b in got for x in b) == sorted(x for b in expected for x in b)
