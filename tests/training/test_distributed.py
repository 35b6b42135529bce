"""Real processes under torch.distributed (gloo): three launched by torchrun itself, the layout users get
from it; four as tests/ranks.py runs them (torchrun's environment, without an interpreter a rank)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset.plan.permutation import permute
from tests_helpers import rank_results, run_ranks, torchrun_cmd, worker_env

pytestmark = pytest.mark.slow  # torchrun jobs: not in make test-quick


def run_job(worker: str, w: int, meta: Path, tmp_path: Path, *, torchrun: bool = False) -> list[dict[str, Any]]:
    """Run ``w`` ranks of ``tests/<worker>`` on ``meta`` (under torchrun itself with ``torchrun``); what
    each rank wrote."""
    out = tmp_path / "result"
    if torchrun:
        cmd = torchrun_cmd(worker, w, meta, out, log_dir=tmp_path / "logs")
        proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=240)
    else:
        proc = run_ranks(worker, w, meta, out, env=worker_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return rank_results(out, w)


def test_three_ranks_get_the_exact_layout(write_meta, tmp_path: Path) -> None:
    n, w, m = 1001, 3, 2
    meta = write_meta(n=n)
    results = run_job("dist_worker.py", w, meta, tmp_path, torchrun=True)
    assert [r["world_size"] for r in results] == [w] * w

    r_ = -(-n // (w * m))
    order = permute(n, 11, 3, np.arange(r_ * w * m) % n)
    for mini in range(m):
        gathered = results[0][f"indices_{mini}"]
        assert all(res[f"indices_{mini}"] == gathered for res in results)  # every rank saw the same
        for rank, got in enumerate(gathered):
            assert got == order[mini * r_ * w + rank + np.arange(r_) * w].tolist()
        # rank 1 through a DataLoader with two workers: each of its samples exactly once
        assert sorted(results[1][f"loader_{mini}"]) == sorted(results[1][f"expected_{mini}"])
        assert len(results[1][f"loader_{mini}"]) == r_


def test_aug_repeats_copies_share_a_step_on_two_ranks(write_meta, tmp_path: Path) -> None:
    n, w, k, m = 1000, 4, 2, 2
    meta = write_meta(n=n)
    lines = meta.read_text().splitlines()
    results = run_job("aug_worker.py", w, meta, tmp_path)
    r_ = -(-n // (w * m))
    d = -(-n // k)
    stream = np.concatenate([permute(n, 7, j, np.arange(n)) for j in range(2)])  # the reference, O(N)
    drawn = []
    for epoch in range(2):
        order = np.repeat(stream[epoch * d : (epoch + 1) * d], k)[:n]
        for mini in range(m):
            steps = results[0][f"steps_{epoch}_{mini}"]
            for rank in range(w):
                positions = mini * r_ * w + rank + np.arange(r_) * w  # n is a multiple of W*M: no padding
                expect = [lines[i] for i in order[positions]]
                assert results[rank][f"indices_{epoch}_{mini}"] == order[positions].tolist()
                assert [x for batch in steps[rank] for x in batch] == expect
            for a, b in zip(steps[0], steps[1]):  # ranks 0 and 1 hold the copies of one draw, step by step
                assert a == b
            for a, b in zip(steps[2], steps[3]):
                assert a == b
            for a, c in zip(steps[0], steps[2]):  # two pairs of ranks: two distinct draws
                assert not set(a) & set(c)
            drawn += [x for batch in steps[0] + steps[2] for x in batch]
    assert sorted(drawn) == sorted(lines)  # k = 2 epochs drew every sample once
