"""samples_of against what each rank's DataLoader (with workers) yielded in a 2-rank gloo job with skipped ranges."""

from __future__ import annotations

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
