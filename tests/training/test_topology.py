from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

from rank_dataset.training.topology import get_rank_world_size

_VARS = ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_order_of_sources(clean_env: pytest.MonkeyPatch) -> None:
    monkeypatch = clean_env
    assert get_rank_world_size() == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert get_rank_world_size() == (3, 8)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert get_rank_world_size() == (2, 4)  # torchrun's variables before SLURM's
    assert get_rank_world_size(rank=1) == (1, 4)
    assert get_rank_world_size(rank=0, world_size=1) == (0, 1)
    monkeypatch.delenv("WORLD_SIZE")
    assert get_rank_world_size() == (3, 8)  # a pair counts only when both are set
    monkeypatch.delenv("SLURM_NTASKS")
    assert get_rank_world_size() == (0, 1)


def test_process_group_comes_before_the_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var, value in zip(_VARS, ("2", "4", "5", "6")):
        clean_env.setenv(var, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert get_rank_world_size() == (0, 1)
        assert get_rank_world_size(world_size=3) == (0, 3)
    finally:
        dist.destroy_process_group()
    assert get_rank_world_size() == (2, 4)


def test_errors(clean_env: pytest.MonkeyPatch) -> None:
    monkeypatch = clean_env
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="RANK='x' and WORLD_SIZE='4' must be integers"):
        get_rank_world_size()
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        get_rank_world_size(2, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        get_rank_world_size(0, 0)
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2(x3)")
    with pytest.raises(ValueError, match=r"SLURM_PROCID='0' and SLURM_NTASKS='2\(x3\)' must be integers"):
        get_rank_world_size()
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "2")
    with pytest.raises(
        ValueError,
        match=r"rank must be in \[0, world_size=2\), got 2 \(rank and world_size from the environment "
        r"\(SLURM_PROCID=2, SLURM_NTASKS=2\)\)$",
    ):
        get_rank_world_size()
    # The message says where what was not given came from: here the default world of one.
    monkeypatch.delenv("SLURM_NTASKS")
    with pytest.raises(
        ValueError,
        match=r"rank must be in \[0, world_size=1\), got 1 \(world_size from the default: no process group "
        r"and none of RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS\)$",
    ):
        get_rank_world_size(rank=1)


_SRUN_TASK = """
import json, sys
from rank_dataset import RankDataset
ds = RankDataset(sys.argv[1], reload_cfg={"seed": 5})
print(json.dumps([ds.rank, ds.world_size, ds.indices.tolist()]))
"""


@pytest.mark.slow  # three interpreters that import torch: not in make test-quick
def test_tasks_started_like_srun_split_the_data(write_meta: Callable[..., Path]) -> None:
    # What `srun --ntasks 3 python train.py` gives each task: SLURM's variables, no RANK/WORLD_SIZE.
    path = write_meta(n=100)
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SRUN_TASK, str(path)],
            env={**env, "SLURM_PROCID": str(task), "SLURM_NTASKS": "3"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for task in range(3)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert [(r, w) for r, w, _ in results] == [(0, 3), (1, 3), (2, 3)]
    drawn = [i for _, _, indices in results for i in indices]
    assert len(drawn) == 102 and set(drawn) == set(range(100))  # 34 each: 2 padded by wrapping
