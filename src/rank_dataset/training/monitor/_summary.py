"""The summary: each rank's window as a fixed row of floats, the gathered rows as a dict, the slowest rank.

The monitor gathers the rows (one all-gather of ``len(FIELDS)`` float64 a rank) and every rank turns the
same table into the same dict with :func:`summarize`.

The slowest rank: each rank's *data time* per step is its training loop's mean wait for a batch plus the
time its main thread spent in the dataset's own stages (plan, read or exchange, build, ``set_epoch``), both
per step of the window: the time the other ranks wait for it at the next collective. The rank with the most
is named only when it exceeds the median rank's by at least ``max(SLOW_RATIO x median, SLOW_MS)`` (below
that, differences are what scheduling makes on a busy host); otherwise ``slowest`` is ``{"rank": None,
"stage": None}``. The stage named
is the one whose time per step on that rank exceeds the median rank's by the most; ``"other"`` when none
does (the wait is in collation, the transfer from the workers, or a CPU the rank shares).

The item stages (fetch, parse, transform, replaced) are a *worker's* time a step: the rank's readers' time
(its DataLoader workers', or its own without workers) divided by the number of readers that made items in
the window (``workers``), so that they compare with the data time (the workers run side by side).

Steps are numbered from 0, as the loop's ``enumerate`` and :class:`~rank_dataset.training.steps.StepSampler`
number them; a summary's ``step`` is the last step it covers, ``first_step`` its first.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.stages import RANK_STAGES, STAGES

__all__ = ["FIELDS", "SLOW_MS", "SLOW_RATIO", "line_of", "row_of", "sources_text", "summarize"]

SLOW_RATIO = 0.5
SLOW_MS = 5.0
_HEAD = ("steps", "wait_mean", "wait_p50", "wait_p99", "wait_max", "stalls", "items_made", "step", "time", "workers")
FIELDS = _HEAD + tuple(f"stage_{s}" for s in STAGES)


def row_of(
    waits_ns: npt.NDArray[np.int64],
    stage_ns: Sequence[int],
    stalls: int,
    items: int,
    step: int,
    now: float = 0.0,
    workers: int = 1,
) -> npt.NDArray[np.float64]:
    """This rank's window: the loop's waits (ns, one per step), each stage's nanoseconds in the window (the item
    stages summed over the rank's readers), the items its readers made, the window's last step, the wall time
    (the summary takes the first rank's: the same dict on every rank) and the readers that made items."""
    steps = len(waits_ns)
    ms = waits_ns / 1e6 if steps else np.zeros(1)
    p50, p99 = np.percentile(ms, [50, 99])
    per_step = np.asarray(stage_ns, dtype=np.float64) / 1e6 / max(steps, 1)
    per_step[len(RANK_STAGES) :] /= max(workers, 1)  # a worker's time, as the module says
    head = [steps, ms.mean(), p50, p99, ms.max(), stalls, items, step, now, workers]
    return np.concatenate([np.asarray(head, dtype=np.float64), per_step])


def summarize(table: npt.NDArray[np.float64], *, every: int) -> dict[str, Any]:
    """The summary of the gathered rows (rank order): every rank computes the same dict from the same table."""
    ranks = []
    k = len(_HEAD)
    for r, row in enumerate(table):
        stages = {s: round(float(row[k + j]), 4) for j, s in enumerate(STAGES)}
        data = float(row[1]) + sum(stages[s] for s in RANK_STAGES)
        ranks.append(
            {
                "rank": r,
                "steps": int(row[0]),
                "wait_ms": {"mean": _r(row[1]), "p50": _r(row[2]), "p99": _r(row[3]), "max": _r(row[4])},
                "data_ms": round(data, 4),
                "stages_ms": stages,
                "stalls": int(row[5]),
                "items_made": int(row[6]),
                "workers": int(row[9]),
            }
        )
    step = int(table[:, 7].max()) if len(table) else 0
    steps = int(table[:, 0].max()) if len(table) else 0
    return {
        "kind": "summary",
        "step": step,
        "first_step": step - max(steps, 1) + 1,
        "time": float(table[0, 8]) if len(table) else 0.0,
        "every": every,
        "world_size": len(ranks),
        "threshold": {"ratio": SLOW_RATIO, "ms": SLOW_MS},
        "slowest": slowest(ranks),
        "ranks": ranks,
    }


def slowest(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"rank", "stage", "data_ms", "median_ms"}``: the slowest rank beyond the threshold (see the module)."""
    data = [r["data_ms"] for r in ranks]
    if len(data) < 2:
        return {"rank": None, "stage": None, "data_ms": data[0] if data else 0.0, "median_ms": data[0] if data else 0.0}
    median = statistics.median(data)
    worst = max(range(len(data)), key=data.__getitem__)
    found: dict[str, Any] = {"rank": None, "stage": None, "data_ms": data[worst], "median_ms": round(median, 4)}
    if data[worst] - median < max(SLOW_RATIO * median, SLOW_MS):
        return found
    excess = {s: ranks[worst]["stages_ms"][s] - statistics.median(r["stages_ms"][s] for r in ranks) for s in STAGES}
    stage = max(excess, key=excess.__getitem__)
    found["rank"], found["stage"] = worst, stage if excess[stage] > 0.1 * (data[worst] - median) else "other"
    return found


def line_of(summary: dict[str, Any]) -> str:
    """One log line: the step, the median rank's wait, and the slowest rank (or that none stands out)."""
    ranks = summary["ranks"]
    p50 = statistics.median(r["wait_ms"]["p50"] for r in ranks)
    p99 = statistics.median(r["wait_ms"]["p99"] for r in ranks)
    worst = max(ranks, key=lambda r: r["wait_ms"]["p99"])
    text = (
        f"rank_dataset monitor, steps {summary['first_step']}-{summary['step']}: data wait p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms (median of "
        f"{len(ranks)} ranks; worst p99 {worst['wait_ms']['p99']:.2f} ms on rank {worst['rank']})"
    )
    slow = summary["slowest"]
    if slow["rank"] is None:
        text += "; no rank slower than the threshold"
    else:
        text += (
            f"; slowest rank {slow['rank']} ({slow['stage']}): {slow['data_ms']:.2f} ms of data time a step, "
            f"median {slow['median_ms']:.2f} ms"
        )
    sources = summary.get("sources")
    if sources:
        text += f"; {sources_text(sources)}"
    return text


def sources_text(sources: dict[str, Any]) -> str:
    """``samples by source, steps 0-N: a 1200 (75.0%), b 400 (25.0%)`` (a summary's ``sources``)."""
    total = sum(sources["samples"].values()) or 1
    parts = ", ".join(f"{name} {n} ({n / total:.1%})" for name, n in sources["samples"].items())
    return f"samples by source, steps 0-{sources['step'] - 1}: {parts}"


def _r(x: float) -> float:
    return round(float(x), 4)
