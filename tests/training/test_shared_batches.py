"""shared_batches: one loader per tensor-parallel group, in a 4-rank gloo job of 2 data-parallel replicas x 2
tensor-parallel ranks (a DeviceMesh), with DataLoader workers; and its checks of its arguments in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, StepSampler, shared_batches
from shared_batches_worker import CFG, GLOBAL_BATCH, STEPS, STOP, collate, summary
from tests_helpers import rank_results, run_ranks, worker_env

WORLD = 4


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("shared")
    meta = tmp / "meta.txt"
    meta.write_text("".join(f"img_{i}.jpg {i % 5}\n" for i in range(60)))
    out = tmp / "out"
    proc = run_ranks("shared_batches_worker.py", WORLD, meta, out, env=worker_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return meta, rank_results(out, WORLD)


def by_place(results: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["dp"], r["tp"]): r for r in results}


def test_the_ranks_of_a_tensor_parallel_group_get_the_same_batches_and_the_replicas_different_ones(job) -> None:
    _, results = job
    place = by_place(results)
    assert sorted(place) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for dp in (0, 1):
        first, other = place[(dp, 0)], place[(dp, 1)]
        for part in ("straight", "resumed", "epoch"):
            assert first[part] == other[part], (dp, part)
        assert len(first["straight"]) == STEPS and first["length"] == len(first["epoch"]) > 0
    for step in range(STEPS):  # the replicas' halves of a global batch: different samples
        lines = [set(place[(dp, 0)]["straight"][step]["lines"]) for dp in (0, 1)]
        assert lines[0] and not lines[0] & lines[1]
    epochs = [{line for b in place[(dp, 0)]["epoch"] for line in b["lines"]} for dp in (0, 1)]
    assert not epochs[0] & epochs[1]  # the epoch layout: a partition of the mini-epoch
    assert len(epochs[0] | epochs[1]) == 60 // CFG["mini_epoch"]


def test_the_batches_are_the_plan_s_global_batches(job) -> None:
    """The replicas' batches of a step, in data-parallel order, are the one-rank run's global batch."""
    meta, results = job
    place = by_place(results)
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=1)
    reference = [
        summary(b)
        for _, b in zip(range(STEPS), DataLoader(ds, batch_sampler=StepSampler(ds, GLOBAL_BATCH), collate_fn=collate))
    ]
    for step in range(STEPS):
        got = place[(0, 0)]["straight"][step]["lines"] + place[(1, 0)]["straight"][step]["lines"]
        assert got == reference[step]["lines"]
        numbers = place[(0, 1)]["straight"][step]["numbers"] + place[(1, 1)]["straight"][step]["numbers"]
        assert numbers == reference[step]["numbers"]


def test_a_resume_from_any_rank_s_state_continues_the_stream(job) -> None:
    _, results = job
    place = by_place(results)
    states = [r["state"] for r in results]
    assert states[0]["step"] == STOP
    for dp in (0, 1):  # the same state on every rank of a group
        assert place[(dp, 0)]["state"] == place[(dp, 1)]["state"]
    for r in results:
        assert r["resumed"] == r["straight"][STOP:]


def test_the_ranks_that_do_not_load_build_nothing_and_open_nothing(job) -> None:
    _, results = job
    place = by_place(results)
    for dp in (0, 1):
        first, other = place[(dp, 0)], place[(dp, 1)]
        assert first["during"]["children"] == 2 and first["during"]["segments"] > 0  # its 2 workers, its shard
        assert other["during"] == other["after"] == {"meta_fds": 0, "segments": 0, "children": 0}
    print("\nrank (dp, tp)  CPU s  PSS MiB")  # the report: a rank that loads against one that does not
    for key in sorted(place):
        u = place[key]["usage"]
        print(f"{key}  {u['cpu_s']:.2f}  {u['pss_mib']:.0f}")


def test_an_error_of_the_loader_is_raised_on_every_rank_of_the_group(job) -> None:
    _, results = job
    place = by_place(results)
    for dp in (0, 1):
        assert place[(dp, 0)]["error"] == "OSError: the disk went away"
        assert place[(dp, 1)]["error"].startswith("RuntimeError: the loader on rank ")
        assert "OSError: the disk went away" in place[(dp, 1)]["error"]
        assert "has no resume state" in place[(dp, 0)]["no_state"]
        assert place[(dp, 1)]["no_state"].startswith("on rank ") and "has no resume state" in place[(dp, 1)]["no_state"]


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"initialised torch\.distributed process group"):
        shared_batches([1], None)
