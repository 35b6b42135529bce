"""Per-source counts after a mid-epoch resume: the first ``consumed()`` of a resumed run by steps over a mix by
epochs, from the epoch's start (what a state without its counts leaves: every draw of the epoch so far
evaluated) and from the counts the state carries (``"counted"``: only the draws since the state).

The plan alone (no files): a mix of three sources by epochs with ``T0`` samples an epoch, global batches of
``B``, a state saved at draw ``fraction * T0`` of epoch 1. CPU seconds (``time.process_time``) of:

1. the resumed process's first ``consumed(step=t)`` at the state's step;
2. its call 100 steps later (what the monitor asks every 100 steps);
3. the counts a state saved 100 steps later carries (``state_dict``'s part).

Usage:
    python benchmarks/bench_consumed.py                          # T0 = 1e9, the state at 41% of the epoch
    python benchmarks/bench_consumed.py --samples 1000000 --out /tmp/results
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import barh, load_note, machine_info, ratio, save_results  # noqa: E402


def _counter(samples: int, batch: int) -> Any:
    from rank_dataset.plan.consumed import RunCounter
    from rank_dataset.plan.mix import MixPlan
    from rank_dataset.plan.schedule import BatchSchedule
    from rank_dataset.plan.steps import StepLayout

    sizes = (samples // 2, samples // 3, samples // 10)
    counts = (samples // 2, samples // 3, samples - samples // 2 - samples // 3)
    mix = MixPlan(sizes, counts, samples)
    return RunCounter(StepLayout(BatchSchedule.of(batch)), samples, 0, 1, mix)


def _cpu(call: Any) -> tuple[float, Any]:
    start = time.process_time()
    out = call()
    return time.process_time() - start, out


def measure(samples: int, batch: int, fraction: float) -> dict[str, Any]:
    step = (samples + int(fraction * samples)) // batch  # in epoch 1, ``fraction`` of it drawn
    later = step + 100
    fresh = _counter(samples, batch)  # a state without its counts: the epoch's prefix evaluated
    first, table = _cpu(lambda: fresh.per_segment([(0, step)]))
    again, _ = _cpu(lambda: fresh.per_segment([(0, later)]))
    anchor = fresh.anchor_at(step)  # what the state saved at ``step`` carries (the same counts)
    resumed = _counter(samples, batch)
    resumed.seed(anchor)
    carried, same = _cpu(lambda: resumed.per_segment([(0, step)]))
    carried_again, _ = _cpu(lambda: resumed.per_segment([(0, later)]))
    state, _ = _cpu(lambda: resumed.anchor_at(later))
    assert [r.tolist() for _, r in same] == [r.tolist() for _, r in table]  # exact: the same counts either way
    return {
        "samples": samples,
        "batch": batch,
        "fraction": fraction,
        "draws before the state in its epoch": step * batch - samples,
        "first call": {"from the epoch's start": first, "from the state's counts": carried},
        "100 steps later": {"from the epoch's start": again, "from the state's counts": carried_again},
        "state_dict's counts 100 steps later": state,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=float, default=1e9, help="T0, the samples of an epoch")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--fraction", type=float, default=0.41, help="of the epoch drawn at the state")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    m = measure(int(args.samples), args.batch, args.fraction)
    first, later = m["first call"], m["100 steps later"]
    start, kept = "from the epoch's start", "from the state's counts"
    a, b = first[start], first[kept]
    state = m["state_dict's counts 100 steps later"]
    rows = [
        f"# consumed() after a mid-epoch resume, T0 = {m['samples']:,}, B = {m['batch']:,}",
        "",
        f"A mix of 3 sources by epochs, the state saved {m['draws before the state in its epoch']:,} draws into "
        "epoch 1. CPU seconds of the resumed process (the plan alone, its threads together; the counts are the same).",
        "",
        "| call | from the epoch's start (s) | from the state's counts (s) | ratio |",
        "|---|---|---|---|",
        f"| first consumed() at the state's step | {a:.3f} | {b:.6f} | {ratio(a, b)} |",
        f"| consumed() 100 steps later | {later[start]:.6f} | {later[kept]:.6f} | - |",
        f"| a state's counts 100 steps later | - | {state:.6f} | - |",
        "",
        f"{machine_info()} Load average {load_note()}.",
    ]
    save_results(
        args.out,
        "consumed",
        rows,
        m,
        lambda path: barh(
            path,
            {"from the epoch's start": a, "from the state's counts": b},
            "CPU seconds, first consumed() after the resume",
            2.0,
        ),
    )


if __name__ == "__main__":
    main()
