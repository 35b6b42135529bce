"""Four ranks are killed mid-epoch; the job resumes on four and on three ranks and loses nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from rank_dataset.plan.spec import mini_epoch_width
from tests_helpers import kill_tree, run_ranks, torchrun_cmd, worker_env

pytestmark = pytest.mark.slow  # torchrun jobs: not in make test-quick

N = 1001


def torchrun(nproc: int, meta: Path, work: Path, phase: str) -> subprocess.Popen[bytes]:
    cmd = torchrun_cmd("resume_worker.py", nproc, meta, work, phase, log_dir=work / f"logs_{phase}")
    return subprocess.Popen(
        cmd, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("resume")
    meta = work / "meta.txt"
    meta.write_text("".join(f"img_{i}.JPEG {i % 10}\n" for i in range(N)))
    job = torchrun(4, meta, work, "first")
    try:
        deadline = time.monotonic() + 120
        logs = [work / f"consumed.{r}.jsonl" for r in range(4)]
        while time.monotonic() < deadline:
            if (work / "state.json").exists() and all(p.exists() and p.read_text().count("\n") >= 6 for p in logs):
                break
            assert job.poll() is None, job.stderr.read().decode() if job.stderr else ""
            time.sleep(0.1)
        else:
            pytest.fail("the first run did not reach its checkpoint")
    finally:
        # Preemption: no chance to clean up. torchrun, its ranks (in sessions of their own) and
        # their DataLoader workers all go, and are waited for.
        kill_tree(job)
    return meta, work


@pytest.mark.parametrize("world", [4, 3])
def test_resume_after_kill(killed_run: tuple[Path, Path], world: int) -> None:
    meta, work = killed_run
    state = json.loads((work / "state.json").read_text())
    consumed = state["consumed"]
    before: list[int] = []
    for r in range(4):
        for line in (work / f"consumed.{r}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry["step"] * 10 < consumed:  # consumed before the checkpoint; later work is redone
                before += entry["samples"]
    # The resume as forks of one process that imported torch (torchrun's environment): the killed run above is
    # the one that needs torchrun (its agent and the ranks' sessions, killed as a preemption kills them).
    job = run_ranks("resume_worker.py", world, meta, work, "resume", env=worker_env(), timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    gathered = json.loads((work / f"after.{world}.json").read_text())
    after = [i for g in gathered for i in g["samples"]]
    lengths = [g["lengths"] for g in gathered]
    assert all(x == lengths[0] for x in lengths) and len(lengths[0]) == 2  # equal per rank, both mini-epochs
    counts = np.bincount(np.array(before + after), minlength=N)
    assert counts.min() >= 1  # no sample lost
    # no repeat beyond padding: the plan's padding plus the wrap of spreading the rest over W2 ranks
    r_old = mini_epoch_width(N, 4, 2) // 4
    left = r_old * 4 - consumed * 4
    expected_pad = (
        (r_old * 4 * 2 - N) + (-(-left // world) * world - left) + (-(-r_old * 4 // world) * world - r_old * 4)
    )
    assert counts.sum() - N == expected_pad
