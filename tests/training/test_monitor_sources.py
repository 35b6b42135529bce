"""Per-source accounting: StepSampler.consumed() against what the ranks' DataLoaders yielded, and the monitor's
summaries and exporters (real prometheus_client text exposition, a real TensorBoard event file) carrying it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler
from rank_dataset.training.monitor.report import load_run, summary_text

CFG = {"mini_epoch": 2, "seed": 9}


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


def _files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, n in [("a", 41), ("b", 17), ("c", 6)]:
        out[name] = tmp_path / f"{name}.txt"
        out[name].write_text("".join(f"{name}{i}\n" for i in range(n)))
    return out


def _make(kind: str, files: dict[str, Path], rank: int, world: int) -> RankDataset:
    a, b, c = (str(files[x]) for x in "abc")
    if kind == "plain":
        return RankDataset(a, reload_cfg=CFG, rank=rank, world_size=world)
    if kind == "epochs":
        sources = [Source(a, weight=2), Source(b, repeat={0: 1, 2: 2}), Source(c, choose=5)]
        return RankDataset(sources, reload_cfg={**CFG, "epoch_size": 60}, rank=rank, world_size=world)
    if kind == "epochs_aug":
        sources = [Source(a, weight=2), Source(b, repeat=1)]
        cfg = {**CFG, "epoch_size": 40, "aug_repeats": 2}
        return RankDataset(sources, reload_cfg=cfg, rank=rank, world_size=world)
    if kind == "steps":
        sources = [
            Source(a, weight={0: 1, 6: 4}, by="step"),
            Source(b, weight=1),
            Source(c, choose={0: 2, 9: 8}, by="step"),
        ]
        return RankDataset(sources, reload_cfg=CFG, rank=rank, world_size=world)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["plain", "epochs", "epochs_aug", "steps"])
def test_consumed_is_what_every_rank_yielded_together_the_same_on_every_rank(kind: str, tmp_path: Path) -> None:
    files = _files(tmp_path)
    schedule = {0: 4, 5: 8, 11: 12}
    steps = 23  # several epochs of the smaller plans, a window change mid-epoch
    for world in (1, 2, 4):
        seen: Counter[str] = Counter()
        answers = []
        for r in range(world):
            ds = _make(kind, files, r, world)
            sampler = StepSampler(ds, schedule)
            loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=1 if r == 0 else 0)
            for _, batch in zip(range(steps), loader):
                seen.update(line[0] for line in batch)  # each line names its file: a12 is of a.txt
            answers.append(sampler.consumed(step=steps))
            del loader
        assert all(a == answers[0] for a in answers)  # the same on every rank
        got = answers[0]
        names = {"a": "a.txt", "b": "b.txt", "c": "c.txt"} if kind != "plain" else {"a": "all"}
        assert got["step"] == steps
        assert got["sources"] == {names[k]: v for k, v in sorted(seen.items())}, (world, got, seen)
        assert {n: sum(e[n] for e in got["epochs"]) for n in got["sources"]} == got["sources"]
        assert len(got["epochs"]) >= 2


@pytest.mark.parametrize("kind", ["plain", "epochs", "steps"])
def test_consumed_leaves_out_skipped_batches(kind: str, tmp_path: Path) -> None:
    files = _files(tmp_path)
    steps, skip = 15, [(3, 6), (10, 12)]  # loop steps 0-14 receive data batches 0-2, 6-9, 12-19
    seen: Counter[str] = Counter()
    answers = []
    for r in range(2):
        ds = _make(kind, files, r, 2)
        sampler = StepSampler(ds, {0: 4, 7: 8}, skip=skip)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)
        for _, batch in zip(range(steps), loader):
            seen.update(line[0] for line in batch)
        answers.append(sampler.consumed(step=steps))
        del loader
    assert answers[0] == answers[1]
    names = {"a": "a.txt", "b": "b.txt", "c": "c.txt"} if kind != "plain" else {"a": "all"}
    assert answers[0]["sources"] == {names[k]: v for k, v in sorted(seen.items())}
    unskipped = StepSampler(_make(kind, files, 0, 1), {0: 4, 7: 8}).consumed(step=steps)
    assert sum(unskipped["sources"].values()) != sum(answers[0]["sources"].values())


def test_consumed_defaults_to_the_batches_handed_out_and_names_sources_given_twice(tmp_path: Path) -> None:
    files = _files(tmp_path)
    a = str(files["a"])
    ds = RankDataset([Source(a, weight=1), Source(a, weight=3)], reload_cfg={**CFG, "epoch_size": 40})
    sampler = StepSampler(ds, 8)
    assert sampler.source_names == ["a.txt#0", "a.txt#1"]
    assert sampler.consumed() == {"step": 0, "sources": {"a.txt#0": 0, "a.txt#1": 0}, "epochs": []}
    batches = iter(sampler)
    for _ in range(3):
        next(batches)
    assert sampler.consumed()["step"] == 3 and sum(sampler.consumed()["sources"].values()) == 24
    with pytest.raises(ValueError, match="step"):
        sampler.consumed(step=-1)


def _monitored(tmp_path: Path, start: int, exporters: list[Any]) -> tuple[Any, Any, list[dict[str, Any]]]:
    import rank_dataset

    files = _files(tmp_path)
    ds = _make("epochs", files, 0, 1)
    sampler = StepSampler(ds, {0: 4, 7: 8}, start_step=start)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=1)
    summaries = []
    with rank_dataset.monitor(loader, every=5, exporters=exporters, out=tmp_path / "run") as m:
        for _, _batch in zip(range(20), m):
            latest = m.summary()
            if latest is not None and (not summaries or summaries[-1]["step"] != latest["step"]):
                summaries.append(latest)
    return m, sampler, summaries


def test_the_summaries_and_the_exporters_carry_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    import prometheus_client.values as values
    from prometheus_client.parser import text_string_to_metric_families
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rank_dataset.training.monitor import Prometheus, TensorBoard

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    textfile = tmp_path / "rank_dataset.prom"
    exporters = [Prometheus(tmp_path / "prom", textfile=textfile), TensorBoard(tmp_path / "tb")]
    with caplog.at_level(logging.INFO, logger="rank_dataset.monitor"):
        _, sampler, summaries = _monitored(tmp_path, 0, exporters)
    assert [s["step"] for s in summaries] == [4, 9, 14, 19]
    for s in summaries:  # steps 0..step: the plan's count through the summary's last step
        assert s["sources"] == {"step": s["step"] + 1, "samples": sampler.consumed(step=s["step"] + 1)["sources"]}
    last = summaries[-1]["sources"]["samples"]
    assert sum(last.values()) == 7 * 4 + 13 * 8 and set(last) == {"a.txt", "b.txt", "c.txt"}
    # The log line and the report's text say the same.
    text = ", ".join(f"{k} {v} ({v / sum(last.values()):.1%})" for k, v in last.items())
    assert caplog.records[-1].getMessage().endswith(f"; samples by source, steps 0-19: {text}")
    assert f"samples by source, steps 0-19: {text}" in summary_text(*load_run(tmp_path / "run"))
    # The Prometheus text exposition, parsed by prometheus_client's own parser.
    families = {f.name: f for f in text_string_to_metric_families(textfile.read_text())}
    counter = families["rank_dataset_source_samples"]
    assert counter.type == "counter"
    exposed = {s.labels["source"]: s.value for s in counter.samples if s.name == "rank_dataset_source_samples_total"}
    assert exposed == {k: float(v) for k, v in last.items()}
    # The TensorBoard event file, read back.
    acc = EventAccumulator(str(tmp_path / "tb" / "rank-0"))
    acc.Reload()
    for name in last:
        events = acc.Scalars(f"rank_dataset/source_samples/{name}")
        assert [e.step for e in events] == [4, 9, 14, 19]
        assert [int(e.value) for e in events] == [s["sources"]["samples"][name] for s in summaries]


def test_a_resumed_run_is_numbered_by_the_samplers_steps(tmp_path: Path) -> None:
    _, sampler, summaries = _monitored(tmp_path, 30, [])
    assert [s["step"] for s in summaries] == [34, 39, 44, 49]  # the loop's steps 30..49
    assert summaries[0]["first_step"] == 30
    assert summaries[-1]["sources"] == {"step": 50, "samples": sampler.consumed(step=50)["sources"]}
    assert sum(summaries[-1]["sources"]["samples"].values()) == 7 * 4 + 43 * 8  # the run's, from step 0


@pytest.mark.slow
def test_two_gloo_ranks_report_the_same_sources(tmp_path: Path) -> None:
    """A real 2-rank gloo job: every summary's samples by source the same on both ranks, and the plan's."""
    from tests_helpers import rank_results, run_ranks, worker_env

    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"img_{i}.JPEG\n" for i in range(150)))
    out, run_dir = tmp_path / "result", tmp_path / "run"
    proc = run_ranks("monitor_worker.py", 2, "sources", meta, out, run_dir, 40, env=worker_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = rank_results(out, 2)
    assert results[0]["summaries"] == results[1]["summaries"]
    assert [s["sources"]["step"] for s in results[0]["summaries"]] == [10, 20, 30, 40]
    assert results[0]["summaries"][-1]["sources"]["samples"] == results[0]["consumed"]["sources"]
    assert sum(results[0]["consumed"]["sources"].values()) == 40 * 8
    assert set(results[0]["consumed"]["sources"]) == {"meta.txt", "meta.txt.other"}
