"""The monitor's report as a new user reads it: the stall in the PNG (its rank, its stage, a legend entry), the
stage colours, the slowest rank's marks, one step numbering in the log, the JSON and the report, a worker's
stage times, ``items_made`` and the INFO log lines. Figures are checked as matplotlib objects, not pixels."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from rank_dataset.core.stages import ITEM_STAGES, RANK_STAGES, STAGES
from rank_dataset.training.monitor._summary import FIELDS, row_of, summarize
from rank_dataset.training.monitor.report import (
    SLOWEST_COLOUR,
    STAGE_COLOURS,
    figure_of,
    load_run,
    stage_colour,
    summary_text,
    write_report,
)

STALL_STEP = 3  # the step (from 0) whose batch the transform holds up
_calls = 0


def _collate(batch: list[Any]) -> list[Any]:
    return batch


def _stalls_once(item: Any) -> Any:
    """Sleeps in the first item of step STALL_STEP (batches of 2, no workers: the items are made in order)."""
    global _calls
    _calls += 1
    if _calls == 2 * STALL_STEP + 1:
        import time

        time.sleep(1.5)
    return item


@pytest.fixture
def stalled_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Path, Any]:
    """A real run whose loop waits 1.5 s for the batch of step STALL_STEP (stall_after=0.4 s)."""
    from torch.utils.data import DataLoader

    import rank_dataset
    from rank_dataset import RandomSampler, RankDataset

    global _calls
    _calls = 0
    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"img_{i}.JPEG {i % 5}\n" for i in range(40)))
    ds = RankDataset(meta, parser="label", transform=_stalls_once)
    loader = DataLoader(ds, batch_size=2, sampler=RandomSampler(ds), collate_fn=_collate)
    with (
        caplog.at_level(logging.INFO, logger="rank_dataset.monitor"),
        rank_dataset.monitor(loader, every=5, out=tmp_path / "run", stall_after=0.4) as m,
    ):
        for _ in m:
            pass
    return tmp_path / "run", caplog


def test_a_stall_is_numbered_alike_in_the_log_the_json_and_the_report(stalled_run: tuple[Path, Any]) -> None:
    run, caplog = stalled_run
    records = [json.loads(line) for line in (run / "rank-0.jsonl").read_text().splitlines()]
    (stall,) = [r for r in records if r["kind"] == "stall"]
    assert stall["step"] == STALL_STEP and stall["stage"] == "transform"
    warnings = [r for r in caplog.get_records("setup") if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"for the batch of step {STALL_STEP}, in transform" in warnings[0].getMessage()
    summaries, events = load_run(run)
    assert [(s["first_step"], s["step"]) for s in summaries] == [(0, 4), (5, 9), (10, 14), (15, 19)]
    text = summary_text(summaries, events)
    assert "steps 0-19 (numbered from 0" in text
    assert f"rank 0, step {STALL_STEP}: waited" in text and "in transform" in text
    # The summary at INFO: one record a summary, naming its steps the same way.
    infos = [r.getMessage() for r in caplog.get_records("setup") if r.levelno == logging.INFO]
    assert [line.split(":")[0] for line in infos] == [
        f"rank_dataset monitor, steps {a}-{b}" for a, b in [(0, 4), (5, 9), (10, 14), (15, 19)]
    ]


def test_the_stall_line_has_its_rank_its_stage_and_a_legend_entry(stalled_run: tuple[Path, Any]) -> None:
    run, _ = stalled_run
    summaries, events = load_run(run)
    fig = figure_of(summaries, events)
    top, bottom = fig.axes
    dotted = [line for line in top.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == 1
    (stall,) = dotted
    assert stall.get_label().startswith(f"stall: rank 0, step {STALL_STEP}, transform, ")
    assert list(stall.get_xdata()) == [STALL_STEP, STALL_STEP]
    assert to_rgba(stall.get_color()) == to_rgba(STAGE_COLOURS["transform"])
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert stall.get_label() in legend
    # The stage bars show the stall's stage in the same colour.
    bars = {c.get_label(): c for c in bottom.containers}
    assert to_rgba(bars["transform"].patches[0].get_facecolor()) == to_rgba(STAGE_COLOURS["transform"])
    assert "transform" in [t.get_text() for t in bottom.get_legend().get_texts()]
    png = write_report(run)
    assert png.endswith(str(run / "report.png")) and (run / "report.png").read_bytes().startswith(b"\x89PNG")
    import matplotlib.pyplot as plt

    plt.close(fig)


def _table(data: list[float], transform: list[float], workers: int = 2) -> np.ndarray:
    rows = []
    for step_ms, t in zip(data, transform):
        stages = [0] * len(STAGES)
        stages[STAGES.index("transform")] = int(t * 1e6 * 10 * workers)  # ns over 10 steps, summed over workers
        rows.append(row_of(np.full(10, int(step_ms * 1e6), np.int64), stages, 0, 40, 9, 0.0, workers))
    return np.stack(rows)


def test_stage_colours_are_fixed_and_the_slowest_rank_has_its_own() -> None:
    import matplotlib.pyplot as plt

    # No stage is red nor black; each its own colour; a stage unknown to the map gets a fixed spare one.
    colours = [to_rgba(stage_colour(s)) for s in STAGES]
    assert len(set(colours)) == len(STAGES)
    assert to_rgba("tab:red") not in colours and to_rgba(SLOWEST_COLOUR) not in colours
    assert stage_colour("not_a_stage_yet") == stage_colour("not_a_stage_yet")
    # Two runs with different stages shown: a stage keeps its colour.
    slow = summarize(_table([1.0, 1.1, 30.0, 0.9], [0.5, 0.5, 20.0, 0.5]), every=10)
    assert slow["slowest"]["rank"] == 2 and slow["slowest"]["stage"] == "transform"
    other = summarize(_table([1.0, 1.0], [0.0, 0.0]), every=10)
    other["ranks"][1]["stages_ms"]["read"] = 3.0
    for summaries in ([slow], [other]):
        fig = figure_of(summaries, [])
        top, bottom = fig.axes
        for container in bottom.containers:
            label = container.get_label()
            if label in STAGE_COLOURS:
                assert to_rgba(container.patches[0].get_facecolor()) == to_rgba(STAGE_COLOURS[label])
        ranks = {line.get_label(): to_rgba(line.get_color()) for line in top.get_lines()}
        if summaries[0]["slowest"]["rank"] is not None:
            assert ranks["rank 2 (slowest)"] == to_rgba(SLOWEST_COLOUR)
            assert all(c != to_rgba(SLOWEST_COLOUR) for k, c in ranks.items() if k != "rank 2 (slowest)")
            outline = bottom.containers[-1]
            assert outline.get_label() == "slowest rank"
            assert to_rgba(outline.patches[0].get_edgecolor()) == to_rgba(SLOWEST_COLOUR)
        plt.close(fig)


def test_item_stages_are_a_workers_mean_and_the_text_says_so() -> None:
    summary = summarize(_table([5.0, 5.0], [12.0, 12.0], workers=4), every=10)
    for row in summary["ranks"]:
        assert row["workers"] == 4 and row["stages_ms"]["transform"] == pytest.approx(12.0)
    rank_only = row_of(np.full(10, 10**6, np.int64), [10**7] * len(STAGES), 0, 0, 9, 0.0, 4)
    per_step = dict(zip(FIELDS, rank_only.tolist()))
    assert all(per_step[f"stage_{s}"] == pytest.approx(1.0) for s in RANK_STAGES)  # the rank's own: not divided
    assert all(per_step[f"stage_{s}"] == pytest.approx(0.25) for s in ITEM_STAGES)
    text = summary_text([summary], [])
    assert f"item stages ({', '.join(ITEM_STAGES)}): a worker's time a step, the mean over the rank's workers" in text
    assert "(4 a rank)" in text
    assert "items" not in summary["ranks"][0] and summary["ranks"][0]["items_made"] == 40


_SCRIPT = """
import logging, sys
from torch.utils.data import DataLoader
import rank_dataset
from rank_dataset import RandomSampler, RankDataset

if sys.argv[2] == "configured":
    logging.basicConfig(level=logging.INFO)  # the guide's line
ds = RankDataset(sys.argv[1], parser="label")
loader = DataLoader(ds, batch_size=4, sampler=RandomSampler(ds), collate_fn=list)
with rank_dataset.monitor(loader, every=5) as m:
    for _ in m:
        pass
"""


@pytest.mark.parametrize("setup", ["none", "configured"])
def test_the_summary_lines_need_logging_at_info(tmp_path: Path, setup: str) -> None:
    """Unconfigured, Python's logging drops INFO: the guide's one line of set-up is what shows the summaries."""
    import subprocess
    import sys

    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"img_{i}.JPEG {i % 5}\n" for i in range(40)))
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(meta), setup], capture_output=True, text=True, timeout=120, check=True
    )
    shown = [line for line in proc.stderr.splitlines() if "rank_dataset monitor, steps" in line]
    assert len(shown) == (2 if setup == "configured" else 0), proc.stderr
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "monitor.md").read_text()
    assert "logging.basicConfig(level=logging.INFO)" in guide and "INFO" in guide
