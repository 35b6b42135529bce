"""rank_dataset.training.lightning: the example trains for real under lightning.Trainer (DDP, CPU, gloo), is
stopped mid-epoch and resumed on another number of processes; every sample is read as planned."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import pytest

from rank_dataset import RankDataset
from rank_dataset.training.lightning import RankDataModule

pytestmark = pytest.mark.slow  # Lightning Trainer runs: not in make test-quick

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_train.py"
N, MINI, BATCH = 96, 2, 4  # 96 samples: every mini-epoch splits evenly over 2 and over 3 ranks


def _meta(tmp_path: Path) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i}.jpg {i % 10}\n" for i in range(N)))
    return path


def _run(tmp_path: Path, meta: Path, *args: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(meta), "--mini-epochs", str(MINI), "--batch-size", str(BATCH), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-4000:]


def _reads(log: Path) -> dict[int, list[list[int]]]:
    """Per Lightning epoch, each rank's samples in the order trained."""
    reads: dict[int, list[list[int]]] = {}
    for rank, path in enumerate(sorted(log.glob("rank*.jsonl"))):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            per_rank = reads.setdefault(entry["epoch"], [])
            while len(per_rank) <= rank:
                per_rank.append([])
            per_rank[rank] += entry["ids"]
    return reads


def _plan(meta: Path, world_size: int, lightning_epoch: int) -> list[list[int]]:
    """Each rank's samples in Lightning epoch ``lightning_epoch``, as the example's dataset plans them."""
    epoch, mini = divmod(lightning_epoch, MINI)
    cfg = {"mini_epoch": MINI, "seed": 0, "epoch": epoch, "mini_epoch_idx": mini}
    return [
        RankDataset(meta, reload_cfg=cfg, rank=r, world_size=world_size).indices.tolist() for r in range(world_size)
    ]


def test_ddp_run_stopped_mid_epoch_resumes_exactly_on_three_processes(tmp_path: Path) -> None:
    meta = _meta(tmp_path)
    # Two processes with persistent DataLoader workers, "preempted" after batch 3 of Lightning epoch 1.
    _run(
        tmp_path,
        meta,
        "--devices",
        "2",
        "--workers",
        "2",
        "--stop-at",
        "1:3",
        "--checkpoint",
        "stop.ckpt",
        "--reads",
        "first",
    )
    first = _reads(tmp_path / "first")
    assert sorted(first) == [0, 1]
    assert first[0] == _plan(meta, 2, 0)  # every rank its own shard, in order: the plan's samples, each once
    assert first[1] == [rank[: 3 * BATCH] for rank in _plan(meta, 2, 1)]  # 3 batches trained before the stop

    # Resumed from the checkpoint on three processes, without workers.
    _run(tmp_path, meta, "--devices", "3", "--resume", "stop.ckpt", "--reads", "resumed")
    resumed = _reads(tmp_path / "resumed")
    assert sorted(resumed) == [1, 2, 3]
    interrupted = [i for rank in first[1] + resumed[1] for i in rank]
    planned = [i for rank in _plan(meta, 2, 1) for i in rank]
    assert Counter(interrupted) == Counter(planned)  # the rest of the mini-epoch, exactly: nothing twice, nothing lost
    assert [len(rank) for rank in resumed[1]] == [8, 8, 8]
    for epoch in (2, 3):  # later epochs: planned afresh over three ranks
        assert resumed[epoch] == _plan(meta, 3, epoch)
    # Each epoch (two mini-epochs) reads every sample once.
    for epoch in range(2):
        mini_epochs = [first[0], first[1] + resumed[1]] if epoch == 0 else [resumed[2], resumed[3]]
        assert sorted(i for reads in mini_epochs for rank in reads for i in rank) == list(range(N))


@pytest.mark.parametrize("devices", [1, 2])
def test_setup_refuses_lightnings_distributed_sampler(tmp_path: Path, devices: int) -> None:
    # On one device too, where Lightning adds no sampler: the script would fail only on two.
    meta = _meta(tmp_path)
    strategy = "ddp" if devices > 1 else "auto"
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False)  # fit is not run
    dm = RankDataModule(lambda: RankDataset(meta, rank=0, world_size=devices), batch_size=4)
    dm.trainer = trainer
    with pytest.raises(ValueError, match="use_distributed_sampler=False"):
        dm.setup("fit")


def test_arguments(tmp_path: Path) -> None:
    meta = _meta(tmp_path)
    ds = RankDataset(meta, rank=0, world_size=1)
    with pytest.raises(TypeError, match="sets sampler itself"):
        RankDataModule(ds, batch_size=4, sampler=None)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        RankDataModule(ds, batch_size=0)
    with pytest.raises(ValueError, match="eval dataset"):
        RankDataModule(RankDataset(meta, is_test=True, rank=0, world_size=1), batch_size=4)
    with pytest.raises(TypeError, match="train must be a RankDataset"):
        RankDataModule("meta.txt", batch_size=4)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="built in setup"):
        _ = RankDataModule(lambda: ds, batch_size=4).dataset
    dm = RankDataModule(ds, batch_size=4)
    with pytest.raises(ValueError, match="version"):
        dm.load_state_dict({"version": 99})


def test_lightning_epochs_are_mini_epochs(tmp_path: Path) -> None:
    meta = _meta(tmp_path)
    ds = RankDataset(meta, reload_cfg={"mini_epoch": 3}, rank=0, world_size=2)
    dm = RankDataModule(ds, batch_size=5)
    loader = dm.train_dataloader()
    for lightning_epoch in range(7):
        loader.sampler.set_epoch(lightning_epoch)  # what Lightning calls before each epoch
        assert (ds.spec.epoch, ds.spec.mini_epoch_idx) == divmod(lightning_epoch, 3)
        assert len(loader) == -(-len(ds) // 5)
        assert [i for batch in loader for i in batch] == [ds[i] for i in range(len(ds))]


def test_import_rank_dataset_does_not_import_lightning(write_meta: Callable[..., Path]) -> None:
    code = (
        "import sys, rank_dataset\n"
        "from rank_dataset import RankDataset, RandomSampler, ResumableSampler\n"
        f"RankDataset({str(write_meta(n=5))!r}, rank=0, world_size=1)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'accelerate')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
