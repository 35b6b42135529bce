"""The monitor (rank_dataset.monitor) with real gloo ranks and DataLoader workers, and its pieces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests_helpers import rank_results, run_ranks, worker_env


def _meta(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i:06d}.JPEG {i % 7}\n" for i in range(n)))
    return path


def _run(tmp_path: Path, mode: str, nproc: int, lines: int, steps: int, timeout: float) -> tuple[list[Any], str, Path]:
    meta = _meta(tmp_path, lines)
    out, run_dir = tmp_path / "result", tmp_path / "run"
    proc = run_ranks("monitor_worker.py", nproc, mode, meta, out, run_dir, steps, env=worker_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return rank_results(out, nproc), proc.stderr, run_dir


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_slow_transform_on_one_rank_is_named_within_three_summaries(tmp_path: Path) -> None:
    results, log, run_dir = _run(tmp_path, "slow", 4, 4000, 40, timeout=240)
    for r in results:
        assert len(r["summaries"]) >= 3
        third = r["summaries"][2]
        assert third["slowest"]["rank"] == 2, third
        assert third["slowest"]["stage"] == "transform", third
        assert [row["rank"] for row in third["ranks"]] == [0, 1, 2, 3]
        assert third["ranks"][2]["stages_ms"]["transform"] > 20
    # The same summary on every rank, and rank 0's log line names the rank.
    assert all(r["summaries"] == results[0]["summaries"] for r in results)
    assert "slowest rank 2 (transform)" in log
    for rank in range(4):
        kinds = {e["kind"] for e in _jsonl(run_dir / f"rank-{rank}.jsonl")}
        assert kinds == {"summary"}


@pytest.mark.slow
def test_a_hung_transform_in_a_worker_is_dumped_by_its_rank(tmp_path: Path) -> None:
    results, log, run_dir = _run(tmp_path, "hang", 2, 400, 30, timeout=240)
    stall_after = 2.0
    assert results[1]["stalls"] == 1  # once per stall
    assert results[0]["stalls"] == 0
    events = [e for e in _jsonl(run_dir / "rank-1.jsonl") if e["kind"] == "stall"]
    assert len(events) == 1
    event = events[0]
    assert event["rank"] == 1
    assert event["waited_s"] <= stall_after + 10
    hung = [w for w in event["workers"] if w["worker"] == 1]
    assert hung and "hang_transform" in hung[0]["stack"]
    assert hung[0]["stage"] == "transform" and event["stage"] == "transform"  # the stage the stall is in
    assert hung[0]["index"] is not None and hung[0]["where"].startswith(str(tmp_path / "meta.txt"))
    assert "monitor_worker.py" in event["main"] or event["main"]  # the rank's loop, waiting in the loader
    # The log holds the worker's stack with the transform's name, from rank 1.
    assert "DataLoader worker 1 (pid" in log and "of rank 1: on sample" in log
    assert "in hang_transform" in log
    assert "has waited" in log and f"for the batch of step {event['step']}, in transform" in log


@pytest.mark.slow
@pytest.mark.alone  # whether a rank is slow is a matter of time: beside other tests' ranks, one is
def test_a_clean_run_reports_no_stall_and_no_slow_rank(tmp_path: Path) -> None:
    # About 2 minutes: 9600 steps of 4 ranks, a 10 ms training step each, 96 summaries.
    results, _log, run_dir = _run(tmp_path, "clean", 4, 8000, 9600, timeout=900)
    for r in results:
        assert r["stalls"] == 0
        assert len(r["summaries"]) == 96
        assert all(s["slowest"]["rank"] is None for s in r["summaries"]), [s["slowest"] for s in r["summaries"]]
    for rank in range(4):
        assert all(e["kind"] == "summary" for e in _jsonl(run_dir / f"rank-{rank}.jsonl"))


@pytest.mark.slow
def test_the_collective_reader_times_its_exchange_and_its_group_carries_the_summary(tmp_path: Path) -> None:
    # 200 lines on 2 ranks: 25 steps an epoch, so steps 25 and 50 start epochs whose shards are exchanged
    # (epoch 0's was built with the dataset, before the monitor, and its set_epoch(0) builds nothing).
    results, _log, _run_dir = _run(tmp_path, "collective", 2, 200, 60, timeout=240)
    last = [r["summaries"][-1] for r in results]
    assert last[0] == last[1]  # the same summary on both ranks
    for row in last[0]["ranks"]:
        assert row["stages_ms"]["exchange"] > 0 and row["stages_ms"]["plan"] > 0
        assert row["stages_ms"]["read"] == 0  # the collective reader's stage is its exchange
    assert all(len(r["summaries"]) == 6 for r in results)


@pytest.mark.slow
def test_the_summary_is_the_datasets_group(tmp_path: Path) -> None:
    # 4 ranks, the dataset on {0, 2} or {1, 3}: each group's summary has its 2 ranks' rows, the same on both.
    results, _log, _run_dir = _run(tmp_path, "group", 4, 200, 30, timeout=240)
    last = [r["summaries"][-1] for r in results]
    assert all(len(s["ranks"]) == 2 for s in last)
    assert last[0] == last[2] and last[1] == last[3]
    assert all(len(r["summaries"]) == 3 for r in results)


# -- one process: the pieces, the exporters with the real libraries, the report ----------------------------


def _loader(meta: Path, *, workers: int = 0, transform: Any = None, batch: int = 4, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    from rank_dataset import RandomSampler, RankDataset

    ds = RankDataset(meta, reload_cfg={"seed": 1}, parser="label", transform=transform)
    return DataLoader(ds, batch_size=batch, sampler=RandomSampler(ds), num_workers=workers, collate_fn=_collate, **kw)


def _collate(batch: list[Any]) -> list[Any]:
    return batch


def _double(item: Any) -> Any:
    return (item[0], item[1] * 2)


def test_monitor_yields_the_same_batches_and_summarises(tmp_path: Path) -> None:
    import rank_dataset

    loader = _loader(_meta(tmp_path, 200), transform=_double)
    plain = list(loader)
    with rank_dataset.monitor(loader, every=10, out=tmp_path / "run") as m:
        seen = list(m)
        summary = m.summary()
        assert loader.dataset.stages.words[0] == 1
    assert loader.dataset.stages.words[0] == 0  # off again: the plain item path
    assert seen == plain  # the same batches (one sampler, one seed, same epoch)
    # Steps numbered from 0: 50 batches are steps 0-49, the last summary covers 40-49.
    assert summary is not None and summary["step"] == 49 and summary["first_step"] == 40
    assert summary["world_size"] == 1 and "sources" not in summary  # a RandomSampler: no per-source counts
    assert summary["slowest"] == {
        "rank": None,
        "stage": None,
        **{k: summary["slowest"][k] for k in ("data_ms", "median_ms")},
    }
    (row,) = summary["ranks"]
    assert row["steps"] == 10 and row["items_made"] == 40 and row["workers"] == 1
    assert set(row["wait_ms"]) == {"mean", "p50", "p99", "max"}
    assert row["stages_ms"]["transform"] > 0 and row["stages_ms"]["parse"] > 0
    lines = (tmp_path / "run" / "rank-0.jsonl").read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(line)["kind"] == "summary" for line in lines)


def test_worker_stages_reach_the_rank_and_set_epoch_is_timed(tmp_path: Path) -> None:
    import rank_dataset

    loader = _loader(_meta(tmp_path, 400), workers=2, transform=_double)
    with rank_dataset.monitor(loader, every=20) as m:
        for epoch in range(2):
            loader.dataset.set_epoch(epoch)
            for _ in m:
                pass
        rows = [r for r in m.stages.rows()[1:3]]
    assert all(r[0] > 0 for r in rows)  # both workers published their pid
    summary = m.summary()
    assert summary is not None and summary["step"] == 199 and summary["ranks"][0]["workers"] == 2
    stages = summary["ranks"][0]["stages_ms"]
    assert stages["transform"] > 0 and stages["fetch"] > 0
    totals = m._last
    assert all(t > 0 for t in totals[:2]) and totals[3] > 0 and totals[4] > 0


def test_arguments_are_checked(tmp_path: Path) -> None:
    import rank_dataset

    loader = _loader(_meta(tmp_path, 20))
    with pytest.raises(ValueError, match="every"):
        rank_dataset.monitor(loader, every=0)
    with pytest.raises(ValueError, match="stall_after"):
        rank_dataset.monitor(loader, stall_after=0)
    with pytest.raises(TypeError, match="stall_after"):
        rank_dataset.monitor(loader, stall_after="5")
    with pytest.raises(TypeError, match="RankDataset"):
        rank_dataset.monitor([1, 2, 3])
    with pytest.raises(TypeError, match="exporter"):
        rank_dataset.monitor(loader, exporters=[object()])


def test_timed_stages_are_exclusive() -> None:
    import time

    from rank_dataset.core.stages import STAGES, rank_totals, timed

    now = time.monotonic_ns  # the stages' clock: each stage's bounds are read around its own reads of it
    before = rank_totals()
    t0 = now()
    with timed("set_epoch"):
        t1 = now()
        time.sleep(0.02)
        t2 = now()
        with timed("read"):
            t3 = now()
            time.sleep(0.05)
            t4 = now()
        t5 = now()
    t6 = now()
    after = rank_totals()
    delta = {s: after[2 * k] - before[2 * k] for k, s in enumerate(STAGES)}
    assert t4 - t3 <= delta["read"] <= t5 - t2
    # The read inside it is not counted twice: counted, it would add at least t4 - t3 (50 ms) to the
    # 20 ms, beyond the bound (unless the machine stalled the test longer than the 50 ms sleep).
    assert t2 - t1 <= delta["set_epoch"] <= (t3 - t0) + (t6 - t4)


def test_slowest_rank_threshold() -> None:
    from rank_dataset.training.monitor._summary import row_of, summarize

    def row(wait_ms: float, transform_ms: float) -> Any:
        stages = [0] * 9
        stages[7] = int(transform_ms * 1e6 * 10)
        return row_of(np.full(10, int(wait_ms * 1e6), np.int64), stages, 0, 40, 10)

    table = np.stack([row(1.0, 0.5), row(1.2, 0.5), row(30.0, 40.0), row(0.9, 0.4)])
    s = summarize(table, every=10)
    assert s["slowest"]["rank"] == 2 and s["slowest"]["stage"] == "transform"
    # Within max(50 %, 5 ms) of the median: no rank named.
    table = np.stack([row(1.0, 0.5), row(1.2, 0.5), row(5.5, 0.5), row(0.9, 0.4)])
    assert summarize(table, every=10)["slowest"]["rank"] is None
    table = np.stack([row(20.0, 0.5), row(21.0, 0.5), row(29.0, 0.5), row(20.5, 0.4)])  # 29 < 20.75 * 1.5
    assert summarize(table, every=10)["slowest"]["rank"] is None
    # A slow rank whose stages do not explain it: "other".
    table = np.stack([row(1.0, 0.5), row(1.2, 0.5), row(30.0, 0.5), row(0.9, 0.4)])
    assert summarize(table, every=10)["slowest"] == {
        "rank": 2,
        "stage": "other",
        "data_ms": 30.0,
        "median_ms": 1.1,
    }


def test_prometheus_textfile_and_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    import prometheus_client.values as values

    import rank_dataset
    from rank_dataset.training.monitor import Prometheus

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    loader = _loader(_meta(tmp_path, 200), transform=_double)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    textfile = tmp_path / "rank_dataset.prom"
    prom = Prometheus(tmp_path / "prom", port=port, textfile=textfile)
    with rank_dataset.monitor(loader, every=10, exporters=[prom]) as m:
        for _ in m:
            pass
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
    text = textfile.read_text()
    for got in (text, scraped):
        assert 'rank_dataset_data_wait_seconds{quantile="0.5",rank="0"}' in got
        assert 'rank_dataset_stage_seconds_per_step{rank="0",stage="transform"}' in got
        assert 'rank_dataset_step{rank="0"} 49.0' in got
        assert "rank_dataset_slowest_rank -1.0" in got


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import rank_dataset
    from rank_dataset.training.monitor import TensorBoard

    loader = _loader(_meta(tmp_path, 200), transform=_double)
    with rank_dataset.monitor(loader, every=10, exporters=[TensorBoard(tmp_path / "tb")]) as m:
        for _ in m:
            pass
    acc = EventAccumulator(str(tmp_path / "tb" / "rank-0"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rank_dataset/wait_p50_ms", "rank_dataset/stage_ms/transform", "rank_dataset/slowest_rank"} <= tags
    assert [e.step for e in acc.Scalars("rank_dataset/wait_p99_ms")] == [9, 19, 29, 39, 49]
    assert all(e.value > 0 for e in acc.Scalars("rank_dataset/stage_ms/transform"))


def test_profiler_ranges_show_the_stages(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    import rank_dataset
    from rank_dataset.core import stages
    from rank_dataset.training.monitor import ProfilerRanges

    loader = _loader(_meta(tmp_path, 100), transform=_double)
    with (
        profile(activities=[ProfilerActivity.CPU]) as prof,
        rank_dataset.monitor(loader, every=5, exporters=[ProfilerRanges()]) as m,
    ):
        loader.dataset.set_epoch(1)
        for _ in m:
            pass
    names = {e.name for e in prof.events()}
    wanted = {"wait", "set_epoch", "read", "build", "plan", "parse", "transform"}
    assert {f"rank_dataset.{s}" for s in wanted} <= names, sorted(n for n in names if "rank_dataset" in n)
    assert stages.item_hook() is None  # closed: no ranges left behind


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.slow
def test_stall_dump_from_spawned_workers(tmp_path: Path, method: str, caplog: pytest.LogCaptureFixture) -> None:
    import rank_dataset

    loader = _loader(_meta(tmp_path, 64), workers=1, transform=_sleepy, batch=2, multiprocessing_context=method)
    with (
        caplog.at_level("WARNING", logger="rank_dataset.monitor"),
        rank_dataset.monitor(loader, every=1000, stall_after=1.0) as m,
    ):
        for _ in m:
            pass
        dump_dir = m.stages.dump_dir()
    assert m.stalls >= 1
    assert "in _sleepy" in caplog.text and "DataLoader worker 0 (pid" in caplog.text
    assert dump_dir is not None and not Path(dump_dir).exists()  # its temporary directory is gone


def _sleepy(item: Any) -> Any:
    import time

    if item[1] == 3 and item[0].endswith("00003.JPEG"):
        time.sleep(3)
    return item


def test_report_writes_a_png_and_a_summary(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import rank_dataset
    from rank_dataset.cli import cli

    loader = _loader(_meta(tmp_path, 200), transform=_double)
    with rank_dataset.monitor(loader, every=10, out=tmp_path / "run") as m:
        for _ in m:
            pass
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "5 summaries of 1 ranks" in result.output and "stalls: 0" in result.output
    png = (tmp_path / "run" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["report", str(empty)])
    assert result.exit_code != 0 and "no rank-<r>.jsonl files" in result.output


def _fails_on_3(item: Any) -> Any:
    if item[1] == 3:
        raise ValueError("a bad image")
    return item


def test_failures_replaced_are_counted_and_items_match_the_plain_path(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    import rank_dataset
    from rank_dataset import RandomSampler, RankDataset
    from rank_dataset.core.stages import REPLACED

    meta = _meta(tmp_path, 140)
    ds = RankDataset(meta, parser="label", transform=_fails_on_3, on_error="replace", max_failures=None)
    loader = DataLoader(ds, batch_size=7, sampler=RandomSampler(ds), collate_fn=_collate)
    plain = list(loader)
    with rank_dataset.monitor(loader, every=5) as m:
        seen = list(m)
        replaced = sum(row[REPLACED + 1] for row in m.stages.rows())
    assert seen == plain  # the same substitutes
    assert replaced == 20  # the 20 lines labelled 3, each replaced once in the monitored pass
    summary = m.summary()
    assert summary is not None and summary["ranks"][0]["stages_ms"]["replaced"] > 0


def test_a_line_that_fails_to_parse_is_replaced_as_unmonitored(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    import rank_dataset
    from rank_dataset import RandomSampler, RankDataset
    from rank_dataset.core.stages import REPLACED

    meta = tmp_path / "bad.txt"
    meta.write_text("".join(f"img_{i}.JPEG {'x' if i % 10 == 4 else i % 5}\n" for i in range(100)))
    ds = RankDataset(meta, parser="label", on_error="replace", max_failures=None)
    loader = DataLoader(ds, batch_size=8, sampler=RandomSampler(ds), collate_fn=_collate)
    plain = list(loader)
    with rank_dataset.monitor(loader, every=5) as m:
        seen = list(m)
        replaced = sum(row[REPLACED + 1] for row in m.stages.rows())
    assert seen == plain
    assert replaced == 10
