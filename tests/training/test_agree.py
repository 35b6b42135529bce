"""Ranks check that they plan from the same inputs: the comparison, one process, and 2 real gloo ranks."""

from __future__ import annotations

import datetime
import os
import pickle
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import rank_dataset
from rank_dataset import RankDataset, RanksDisagreeError
from rank_dataset.training._agree import _SLOTS, _hashes, agreement_needed, check_ranks_agree, disagreement
from tests_helpers import BLOCK_TORCH, imagenet_line, rank_results, ranks_cmd, worker_env

HERE = Path(__file__).resolve().parent

# -- the comparison, no process group -------------------------------------------------------------


def test_no_process_group_is_a_no_op() -> None:
    assert not dist.is_initialized() and not agreement_needed()
    check_ranks_agree({"num_samples": 1000, "world_size": 7, "anything": object()})


def test_too_many_fields_is_an_error_even_alone() -> None:
    with pytest.raises(ValueError, match="at most 30 fields"):
        check_ranks_agree({f"f{i}": i for i in range(_SLOTS)})


def test_hashes_are_fixed_size_and_name_the_fields() -> None:
    a = _hashes({"num_samples": "1000", "seed": "0"})
    assert len(a) == _SLOTS and a == _hashes({"num_samples": "1000", "seed": "0"})
    assert a[1:3] != _hashes({"num_samples": "1100", "seed": "0"})[1:3]
    assert a[0] != _hashes({"num_samples": "1000", "epoch": "0"})[0]  # other field names
    assert all(-(2**63) <= x < 2**63 for x in a)


def test_message_names_the_first_field_its_values_and_ranks() -> None:
    fields = [{"num_samples": "1000", "fingerprint": "'aa'", "seed": "0"}] * 3
    fields += [{"num_samples": "1100", "fingerprint": "'bb'", "seed": "0"}]
    err = disagreement(fields)
    assert isinstance(err, ValueError) and err.field == "num_samples"
    assert err.values == {"1000": [0, 1, 2], "1100": [3]}
    assert str(err).startswith("ranks disagree on num_samples: 1000 on ranks [0-2], 1100 on ranks [3]")
    assert "(also differ: fingerprint)" in str(err) and "same meta files" in str(err)


def test_message_of_many_ranks_stays_short() -> None:
    fields = [{"epoch": str(r % 2 if r < 1000 else r)} for r in range(1020)]
    err = disagreement(fields)
    text = str(err)
    assert "0 on ranks [0, 2, 4," in text and "30, ... (500 ranks)], 1 on ranks [1, 3," in text
    assert "and 14 more values" in text and len(text) < 1000
    assert "set_epoch" in text  # the plan settings' hint
    assert str(disagreement([{"epoch": "0"}] * 500 + [{"epoch": "1"}] * 500)).startswith(
        "ranks disagree on epoch: 0 on ranks [0-499], 1 on ranks [500-999]"
    )


def test_message_of_other_field_names_and_of_world_size() -> None:
    err = disagreement([{"a": "1"}, {"a": "1", "b": "2"}])
    assert err.field == "(field names)" and "a on ranks [0], a, b on ranks [1]" in str(err)
    err = disagreement([{"world_size": "2"}, {"world_size": "3"}], group_size=2)
    assert "2 on ranks [0], 3 on ranks [1]; the process group has 2 ranks" in str(err)
    with pytest.raises(ValueError, match="no disagreement"):
        disagreement([{"a": "1"}, {"a": "1"}])


def test_a_disagreement_on_the_files_names_each_ranks_paths_and_hints_at_the_files() -> None:
    fields = [{"files": "1", "sizes": "(3077890,)"}, {"files": "1", "sizes": "(3077891,)"}]
    contexts = [{"paths": "['/data/a/meta.txt']"}, {"paths": "['/data/b/meta.txt']"}]
    message = str(disagreement(fields, 2, contexts))
    assert message.startswith("ranks disagree on sizes: (3077890,) on ranks [0], (3077891,) on ranks [1]; ")
    assert "the files: paths ['/data/a/meta.txt'] on ranks [0], paths ['/data/b/meta.txt'] on ranks [1]" in message
    assert "every rank must read the same meta files, with the same contents" in message
    assert "reload_cfg" not in message  # the hint is about the files
    same = str(disagreement(fields, 2, [contexts[0]] * 2))
    assert "every rank reads paths ['/data/a/meta.txt']: the same paths, other contents" in same
    # Outside the files, no paths: a seed that differs is a plan matter.
    assert "paths" not in str(disagreement([{"seed": "0"}, {"seed": "1"}], 2, contexts))


def test_error_is_public_and_pickles() -> None:
    assert rank_dataset.RanksDisagreeError is RanksDisagreeError and "RanksDisagreeError" in rank_dataset.__all__
    err = pickle.loads(pickle.dumps(disagreement([{"seed": "0"}, {"seed": "1"}])))
    assert isinstance(err, RanksDisagreeError) and err.field == "seed" and err.values == {"0": [0], "1": [1]}


def test_imports_and_does_nothing_without_torch() -> None:
    code = BLOCK_TORCH + (
        "from rank_dataset import RanksDisagreeError\n"
        "from rank_dataset.training._agree import check_ranks_agree\n"
        "check_ranks_agree({'num_samples': 1})\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


# -- a process group of one, in this process ------------------------------------------------------


@pytest.fixture
def group_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_group_of_one_checks_world_size_against_the_group(group_of_one: None, write_meta: Any) -> None:
    assert agreement_needed()
    check_ranks_agree({"num_samples": 10, "world_size": 1})
    meta = write_meta(n=50)
    ds = RankDataset(meta, reload_cfg={"seed": 3})
    ds.set_epoch(2)
    assert len(ds) == 50 and ds.world_size == 1
    with pytest.raises(RanksDisagreeError, match=r"world_size: 2 on every rank, but the process group has 1 ranks"):
        RankDataset(meta, rank=0, world_size=2)


# -- two real ranks under torchrun (gloo on loopback) ---------------------------------------------


TORCHRUN = pytest.mark.slow  # the tests of one 2-rank torchrun job: not in make test-quick


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    work = tmp_path_factory.mktemp("agree")
    for name, n in [("meta_0.txt", 1000), ("meta_1.txt", 1100), ("appended.txt", 1000)]:
        (work / name).write_text("".join(f"{imagenet_line(i)}\n" for i in range(n)))
    out = work / "result"
    cmd, env = (
        ranks_cmd("agree_worker.py", 2, work, out),
        worker_env(RANK_DATASET_CACHE_DIR=str(work / "cache")),
    )
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = job.communicate(timeout=180)  # a hang fails here instead of blocking the suite
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail("the 2-rank job hung")
    assert job.returncode == 0, stderr.decode()[-3000:]
    return rank_results(out, 2)


CASES = {
    # case: (field, the message's values part)
    "different_files": ("num_samples", "1000 on ranks [0], 1100 on ranks [1] (also differ: fingerprint)"),
    "appended": ("num_samples", "1000 on ranks [0], 1100 on ranks [1] (also differ: fingerprint)"),
    "different_files_collective": ("sizes", "on ranks [0], "),
    "seed": ("seed", "0 on ranks [0], 1 on ranks [1]"),
    "world_size_differs": ("world_size", "2 on ranks [0], 3 on ranks [1]; the process group has 2 ranks"),
    "set_epoch": ("epoch", "1 on ranks [0], 2 on ranks [1]"),
    "load_state_dict": ("resume", "on ranks [0], ResumePoint("),
    "mix": ("mix", "MixPlan(sizes=(1000, 1100), counts=(250, 250), epoch_size=500) on ranks [0]"),
}


@TORCHRUN
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_that_disagree_both_raise_the_same_error(two_ranks: list[dict[str, Any]], case: str) -> None:
    field, values = CASES[case]
    got = [result[case] for result in two_ranks]
    assert [g["raised"] for g in got] == ["RanksDisagreeError"] * 2, got
    assert got[0]["message"] == got[1]["message"]  # the same error on every rank
    assert got[0]["field"] == field and sorted(r for rs in got[0]["values"].values() for r in rs) == [0, 1]
    assert got[0]["message"].startswith(f"ranks disagree on {field}: ") and values in got[0]["message"]


@TORCHRUN
@pytest.mark.parametrize("case", ["different_files", "different_files_collective"])
def test_ranks_on_other_files_are_told_each_ranks_paths(two_ranks: list[dict[str, Any]], case: str) -> None:
    message = two_ranks[0][case]["message"]
    assert re.search(r"the files: paths \['[^']*meta_0\.txt'\] on ranks \[0\], paths \['[^']*meta_1\.txt'\]", message)
    assert message.endswith("every rank must read the same meta files, with the same contents (did one change "
                            "while the ranks were starting, or does a rank read another copy?)")  # fmt: skip
    appended = two_ranks[0]["appended"]["message"]
    assert re.search(r"every rank reads paths \['[^']*appended\.txt'\]: the same paths, other contents", appended)


@TORCHRUN
def test_two_ranks_claiming_a_world_of_three(two_ranks: list[dict[str, Any]]) -> None:
    got = [result["world_size_vs_group"] for result in two_ranks]
    assert [g["raised"] for g in got] == ["RanksDisagreeError"] * 2 and got[0]["message"] == got[1]["message"]
    assert got[0]["field"] == "world_size" and got[0]["values"] == {"3": [0, 1]}
    assert "world_size: 3 on every rank, but the process group has 2 ranks" in got[0]["message"]


@TORCHRUN
def test_two_processes_claiming_one_rank(two_ranks: list[dict[str, Any]]) -> None:
    got = [result["same_rank"] for result in two_ranks]
    assert [g["raised"] for g in got] == ["RanksDisagreeError"] * 2 and got[0]["message"] == got[1]["message"]
    assert got[0]["field"] == "rank" and got[0]["values"] == {"0": [0, 1]}
    assert "rank 0 on processes [0-1] — each rank in [0, 2) must be held by 1 of" in got[0]["message"]


@TORCHRUN
def test_a_rank_held_by_several_processes_is_fine(two_ranks: list[dict[str, Any]]) -> None:
    assert [r["shared_rank"] for r in two_ranks] == [{"raised": None}] * 2


@TORCHRUN
def test_a_failed_check_leaves_the_dataset_as_it_was(two_ranks: list[dict[str, Any]]) -> None:
    assert all(r["set_epoch"]["unchanged"] and r["load_state_dict"]["unchanged"] for r in two_ranks)


@TORCHRUN
def test_agreeing_ranks_are_not_disturbed(two_ranks: list[dict[str, Any]]) -> None:
    assert [r["agree"] for r in two_ranks] == [{"raised": None, "world_size": 2}] * 2
