"""The Accelerate recipe trains for real: 2 gloo ranks on CPU with torchrun's environment; every sample of each
epoch is read once across the ranks. The mistake the README warns of (prepare(loader)) is shown too."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from rank_dataset import RankDataset
from tests_helpers import run_ranks, worker_env

pytestmark = pytest.mark.slow  # Accelerate launches processes: not in make test-quick

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_train.py"
N, W, MINI, EPOCHS, BATCH = 96, 2, 2, 2, 4


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The ranks have torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), as forks of one process that
    # imported torch (tests/ranks.py): what Accelerate reads to join them is the same, without an interpreter and
    # an import of torch a rank. torchrun's agent itself is run by the torchrun tests (test_resume_distributed).
    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"img_{i}.jpg {i % 10}\n" for i in range(N)))
    options = ["--epochs", EPOCHS, "--mini-epochs", MINI, "--batch-size", BATCH, "--reads", tmp_path / "reads"]
    out = run_ranks(str(EXAMPLE), W, meta, *options, *args, env=worker_env(), timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def _reads(tmp_path: Path) -> dict[tuple[int, int], list[int]]:
    """Per (epoch, mini-epoch), the samples trained on, over all ranks."""
    reads: dict[tuple[int, int], list[int]] = {}
    for path in sorted((tmp_path / "reads").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            reads.setdefault((entry["epoch"], entry["mini"]), []).extend(entry["ids"])
    return reads


def _planned(tmp_path: Path, epoch: int, mini: int) -> list[int]:
    cfg = {"mini_epoch": MINI, "seed": 0, "epoch": epoch, "mini_epoch_idx": mini}
    return [
        i for r in range(W) for i in RankDataset(tmp_path / "meta.txt", reload_cfg=cfg, rank=r, world_size=W).indices
    ]


def test_recipe_reads_every_sample_once(tmp_path: Path) -> None:
    out = _run(tmp_path, "--workers", "1")
    assert "PassAuditWarning" not in out.stderr
    reads = _reads(tmp_path)
    assert sorted(reads) == [(e, m) for e in range(EPOCHS) for m in range(MINI)]
    for (epoch, mini), ids in reads.items():
        assert Counter(ids) == Counter(_planned(tmp_path, epoch, mini))
    for epoch in range(EPOCHS):
        assert sorted(reads[epoch, 0] + reads[epoch, 1]) == list(range(N))  # every sample once an epoch


def test_prepare_loader_shards_twice_and_the_audit_says_so(tmp_path: Path) -> None:
    # The mistake: each rank keeps one batch in W of its own shard, and training goes on as if nothing
    # happened, but for the pass audit: at the next set_epoch each rank warns, once.
    out = _run(tmp_path, "--prepare-loader")
    reads = _reads(tmp_path)
    for epoch in range(EPOCHS):
        read = reads[epoch, 0] + reads[epoch, 1]
        assert len(read) == N // W and len(set(read)) == N // W
    warnings = [line for line in out.stderr.splitlines() if "PassAuditWarning" in line]
    assert len(warnings) == W, out.stderr[-3000:]  # once per dataset, on each rank
    per_rank = N // (W * MINI)
    assert all(
        f"pass 1 over this rank's shard read {per_rank // W} items, but its sampler drew {per_rank}" in line
        for line in warnings
    )
    assert all("accelerator.prepare()" in line for line in warnings)
