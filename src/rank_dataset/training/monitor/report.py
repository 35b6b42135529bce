"""``rank-dataset report DIR``: a monitored run's JSON-lines files as a plot and a short text summary.

Reads ``DIR/rank-<r>.jsonl`` (what :func:`rank_dataset.monitor` writes with ``out=DIR``): the summaries (the
same on every rank: one file's are read, rank 0's if there) and every rank's stall events. The PNG (needs
matplotlib: ``pip install 'rank-dataset[report]'``) has the data wait of each rank over the steps (the
slowest rank drawn in black, the summaries that named it marked; each stall a dotted vertical line in its
stage's colour, in the legend with its rank and stage) and each rank's stage times a step, averaged over the
run (the slowest rank's bar outlined in black). A stage has the same colour in every report
(:data:`STAGE_COLOURS`); no stage is black, nor red.

Steps are numbered from 0 everywhere (the log, the JSON, this report); the item stages are a worker's time a
step (the mean over the rank's workers), as the summaries hold them.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
from pathlib import Path
from typing import Any

from rank_dataset.core.stages import ITEM_STAGES, STAGES
from rank_dataset.training.monitor._summary import sources_text

__all__ = ["SLOWEST_COLOUR", "STAGE_COLOURS", "figure_of", "load_run", "stage_colour", "summary_text", "write_report"]

#: Each stage's colour in the plot, the same in every report (a new stage: one line here).
STAGE_COLOURS = {
    "plan": "tab:blue",
    "read": "tab:orange",
    "exchange": "tab:olive",
    "build": "tab:green",
    "set_epoch": "tab:purple",
    "fetch": "tab:cyan",
    "parse": "tab:brown",
    "transform": "tab:pink",
    "replaced": "tab:gray",
    "other": "gold",
}
#: The slowest rank's colour (its line, its marks, its bar's outline): no stage has it.
SLOWEST_COLOUR = "black"
_SPARE = ("navy", "teal", "darkkhaki", "indigo", "sienna", "lightseagreen")  # a stage missing from the map

_SHOWN = 16  # ranks drawn one by one; past it the others are grey
_STALLS_NAMED = 8  # stalls in the legend; the others drawn alike


def load_run(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(summaries, events)`` of the run in ``directory``: the summaries in step order, the events of
    every rank in time order.

    Raises:
        FileNotFoundError: no ``rank-<r>.jsonl`` file there.
        ValueError: a line that is not JSON.
    """
    root = Path(directory)
    files = sorted(root.glob("rank-*.jsonl"), key=lambda p: (len(p.name), p.name))
    if not files:
        raise FileNotFoundError(f"no rank-<r>.jsonl files in {root}: run with rank_dataset.monitor(..., out={root})")
    per_file: list[list[dict[str, Any]]] = []
    for path in files:
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
        per_file.append(records)
    summaries = [r for r in per_file[0] if r.get("kind") == "summary"]
    summaries.sort(key=lambda s: s["step"])
    events = sorted((r for records in per_file for r in records if r.get("kind") != "summary"), key=_time)
    return summaries, events


def _time(record: dict[str, Any]) -> float:
    return float(record.get("time", 0.0))


def summary_text(summaries: list[dict[str, Any]], events: list[dict[str, Any]]) -> str:
    """A few lines: the run, each rank's data time, the slowest rank named and how often, the samples of each
    source (over a StepSampler), the stalls."""
    if not summaries:
        lines = ["no summary in this run (fewer steps than `every`?)"]
    else:
        world, last = summaries[-1]["world_size"], summaries[-1]
        first = summaries[0].get("first_step", summaries[0]["step"])
        lines = [
            f"{len(summaries)} summaries of {world} ranks, steps {first}-{last['step']} (numbered from 0, every "
            f"{last['every']}); threshold: {last['threshold']['ratio']:.0%} and {last['threshold']['ms']:g} ms a "
            "step over the median rank"
        ]
        data = _mean_by_rank(summaries, lambda r: r["data_ms"])
        p99 = _mean_by_rank(summaries, lambda r: r["wait_ms"]["p99"])
        workers = _mean_by_rank(summaries, lambda r: r.get("workers", 1))
        median = statistics.median(data.values())
        lines.append(f"data time a step (wait + the rank's stages), median rank: {median:.2f} ms")
        lines.append(
            f"item stages ({', '.join(ITEM_STAGES)}): a worker's time a step, the mean over the rank's workers "
            f"({_workers_text(workers)})"
        )
        named = collections.Counter(
            (s["slowest"]["rank"], s["slowest"]["stage"]) for s in summaries if s["slowest"]["rank"] is not None
        )
        if named:
            for (rank, stage), count in named.most_common(3):
                stages = _stages_by_rank(summaries)[rank]
                lines.append(
                    f"slowest: rank {rank} ({stage}) in {count} of {len(summaries)} summaries: {data[rank]:.2f} ms "
                    f"of data time a step, wait p99 {p99[rank]:.2f} ms, {stage} {stages.get(stage, 0.0):.2f} ms a step"
                    + (f" (a worker's, of {workers[rank]:g})" if stage in ITEM_STAGES else "")
                )
        else:
            lines.append("slowest: no rank slower than the threshold in any summary")
        sources = last.get("sources")
        if sources:
            lines.append(sources_text(sources))
    stalls = [e for e in events if e.get("kind") == "stall"]
    lines.append(f"stalls: {len(stalls)}")
    for e in stalls[:5]:
        busy = [w for w in e.get("workers", ()) if w.get("index") is not None]
        where = ", ".join(f"worker {w['worker']} on sample {w['sample']} ({w['where']})" for w in busy)
        where = where or "no worker busy"
        lines.append(
            f"  rank {e['rank']}, step {e['step']}: waited {e['waited_s']:.1f} s in {e.get('stage', 'other')}; {where}"
        )
    return "\n".join(lines)


def _workers_text(workers: dict[int, float]) -> str:
    values = sorted(set(workers.values()))
    if len(values) == 1:
        return f"{values[0]:g} a rank"
    return ", ".join(f"rank {r}: {w:g}" for r, w in sorted(workers.items()))


def _mean_by_rank(summaries: list[dict[str, Any]], value: Any) -> dict[int, float]:
    by: dict[int, list[float]] = collections.defaultdict(list)
    for s in summaries:
        for r in s["ranks"]:
            by[r["rank"]].append(float(value(r)))
    return {rank: statistics.fmean(v) for rank, v in by.items()}


def _stages_by_rank(summaries: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    return {
        rank: {stage: _mean_by_rank(summaries, lambda r, s=stage: r["stages_ms"][s])[rank] for stage in STAGES}
        for rank in (r["rank"] for r in summaries[-1]["ranks"])
    }


def write_report(directory: str | os.PathLike[str], png: str | os.PathLike[str] | None = None) -> str:
    """Write the run's plot to ``png`` (default ``DIR/report.png``); return the text summary (and where)."""
    summaries, events = load_run(directory)
    text = summary_text(summaries, events)
    if not summaries:
        return text
    target = Path(png) if png is not None else Path(directory) / "report.png"
    _plot(summaries, events, target)
    return f"{text}\nplot: {target}"


def _plot(summaries: list[dict[str, Any]], events: list[dict[str, Any]], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure_of(summaries, events)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)


def stage_colour(stage: str) -> str:
    """``stage``'s colour: :data:`STAGE_COLOURS`, or a spare one fixed by its place in the stages."""
    if stage in STAGE_COLOURS:
        return STAGE_COLOURS[stage]
    return _SPARE[(STAGES.index(stage) if stage in STAGES else len(stage)) % len(_SPARE)]


def figure_of(summaries: list[dict[str, Any]], events: list[dict[str, Any]]) -> Any:
    """The report's matplotlib figure (two axes: the waits over the steps, the stages by rank)."""
    import matplotlib.pyplot as plt

    ranks = [r["rank"] for r in summaries[-1]["ranks"]]
    named = collections.Counter(s["slowest"]["rank"] for s in summaries if s["slowest"]["rank"] is not None)
    slow = named.most_common(1)[0][0] if named else None
    steps = [s["step"] for s in summaries]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), constrained_layout=True)
    others = [r for r in ranks if r != slow]
    cmap = plt.get_cmap("viridis")
    for i, rank in enumerate(others):
        series = [s["ranks"][rank]["wait_ms"]["mean"] for s in summaries]
        if len(ranks) <= _SHOWN:
            colour = cmap(i / max(len(others) - 1, 1) * 0.9)
            top.plot(steps, series, color=colour, linewidth=1.2, label=f"rank {rank}")
        else:
            top.plot(steps, series, color="0.7", linewidth=0.8)
    if slow is not None:
        series = [s["ranks"][slow]["wait_ms"]["mean"] for s in summaries]
        top.plot(steps, series, color=SLOWEST_COLOUR, linewidth=2.5, label=f"rank {slow} (slowest)", zorder=3)
        marked = [(s["step"], s["ranks"][slow]["wait_ms"]["mean"]) for s in summaries if s["slowest"]["rank"] == slow]
        top.scatter(*zip(*marked), color=SLOWEST_COLOUR, marker="v", s=40, zorder=4, label="named slowest")
    stalls = [e for e in events if e.get("kind") == "stall"]
    for n, e in enumerate(stalls):
        stage = e.get("stage") or "other"
        label = f"stall: rank {e['rank']}, step {e['step']}, {stage}, {e['waited_s']:.1f} s"
        top.axvline(
            e["step"],
            color=stage_colour(stage),
            linestyle=":",
            linewidth=1.8,
            label=label if n < _STALLS_NAMED else "_nolegend_",
        )
    top.set_xlabel("step (from 0)")
    top.set_ylabel("data wait, mean a step (ms)")
    top.set_title("The training loop's wait for data, per rank (one point a summary: its last step)")
    top.legend(fontsize="small", ncol=2)
    stages = _stages_by_rank(summaries)
    shown = [s for s in STAGES if any(stages[r][s] > 0 for r in ranks)]
    bottoms = [0.0] * len(ranks)
    for stage in shown:
        heights = [stages[r].get(stage, 0.0) for r in ranks]
        bottom.bar([str(r) for r in ranks], heights, bottom=bottoms, label=stage, color=stage_colour(stage))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for stage in sorted({e.get("stage") or "other" for e in stalls} - set(shown)):  # a stall's stage: in the legend
        bottom.bar([str(ranks[0])], [0.0], label=stage, color=stage_colour(stage))
    if slow is not None:
        k = ranks.index(slow)
        bottom.bar([str(slow)], [bottoms[k]], fill=False, edgecolor=SLOWEST_COLOUR, linewidth=2.0, label="slowest rank")
        bottom.annotate("slowest", (k, bottoms[k]), ha="center", va="bottom", color=SLOWEST_COLOUR, fontweight="bold")
    bottom.set_xlabel("rank")
    bottom.set_ylabel("ms a step (item stages: a worker's mean)")
    bottom.set_title("Where each rank's data time goes: the dataset's stages, averaged over the run")
    bottom.legend(fontsize="small", ncol=3)
    return fig
