"""samples_of against what each rank's DataLoader (with workers) yielded in 2-rank gloo jobs with skipped ranges, and
across a mixture edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provenance_worker import LIVE, STEPS
from rank_dataset import samples_of
from tests_helpers import rank_results, run_ranks, worker_env

pytestmark = pytest.mark.slow  # a gloo job: not in make test-quick


def test_samples_of_is_what_each_rank_read(tmp_path: Path) -> None:
    meta, other = tmp_path / "meta.txt", tmp_path / "other.txt"
    meta.write_text("".join(f"img_{i}.jpg {i % 3}\n" for i in range(37)))
    other.write_text("".join(f"doc_{i}.txt {i}\n" for i in range(11)))
    out = tmp_path / "run"
    proc = run_ranks("provenance_worker.py", 2, meta, other, out, env=worker_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, 2)
    assert results[0]["state"] == results[1]["state"]
    assert results[0]["state"]["skip"] == [[2, 4], list(LIVE[1:])]
    manifest = Path(f"{out}.manifest.json")
    trained = set()
    for t in range(STEPS):
        whole = samples_of(manifest, step=t)
        for r in range(2):
            rows = samples_of(manifest, step=t, rank=r, world_size=2)
            assert [row["line"] for row in rows] == results[r]["batches"][t]
        assert [row["line"] for row in whole] == results[0]["batches"][t] + results[1]["batches"][t]
        trained.add(tuple(row["sample"] for row in whole))
    # The skipped data batches are none of the loop steps' (batch= answers them, marked skipped).
    for d in (2, 3, *range(*LIVE[1:])):
        rows = samples_of(manifest, batch=d)
        assert all(row["skipped"] for row in rows) and tuple(row["sample"] for row in rows) not in trained


def test_samples_of_is_what_each_rank_read_across_a_mixture_edit(tmp_path: Path) -> None:
    """A 2-rank job by epochs with a skip, stopped and resumed under another mix (a source kept, one removed, one
    added by step) with a run-time skip: samples_of of the final manifest is what each rank's DataLoader (with
    workers) yielded at every loop step, before the edit and after; consumed() is the lines counted."""
    from collections import Counter

    from provenance_remix_worker import LIVE as EDIT_LIVE

    for name, n in [("a", 13), ("b", 29), ("c", 17)]:
        (tmp_path / f"{name}.txt").write_text("".join(f"{name}_{i}\n" for i in range(n)))
    state, edit, stop = tmp_path / "state.json", 5, 16

    def job(mix: str, last: int) -> list[dict]:
        out = tmp_path / mix
        proc = run_ranks(
            "provenance_remix_worker.py", 2, mix, tmp_path, out, state, last, env=worker_env(), timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return rank_results(out, 2)

    before, after = job("before", edit), job("after", stop)
    assert [r["start"] for r in after] == [edit, edit]
    manifest = Path(f"{tmp_path / 'after'}.manifest.json")
    assert json.loads(manifest.read_text())["steps"]["skip"] == [[2, 3], list(EDIT_LIVE[1:])]
    trained: Counter[str] = Counter()
    for t in range(stop):
        part, at = (before, t) if t < edit else (after, t - edit)
        for r in range(2):
            rows = samples_of(manifest, step=t, rank=r, world_size=2)
            assert [row["line"] for row in rows] == part[r]["batches"][at], (t, r)
            assert all(row["source"] == f"{row['line'][0]}.txt" for row in rows)
            trained.update(f"{line[0]}.txt" for line in part[r]["batches"][at])
    counts = [r["consumed"] for r in after]
    assert counts[0] == counts[1] and counts[0]["sources"] == dict(trained)
    assert [s["batch"] for s in counts[0]["segments"]] == [0, 6]  # the edit at loop step 5: data batch 6
