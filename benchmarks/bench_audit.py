"""The pass audit's cost: item access with the audit counting beside the same dataset with audit="off".

Each reader of a dataset (a DataLoader worker, or the rank without workers) counts the items it reads
in each pass: one store in the control block per batch (``__getitems__``) or per item (``ds[i]``).
This measures what that adds, in one process, both datasets read in alternation in the same run.

Usage:
    python benchmarks/bench_audit.py                 # N = 1M lines, 7 rounds
    python benchmarks/bench_audit.py --lines 20000 --rounds 2 --out /tmp/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine_info, md_table, plotting, save_results, write_imagenet_meta  # noqa: E402

BATCHES = (1, 32, 256)


def seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    import numpy as np

    from rank_dataset import RandomSampler, RankDataset

    with tempfile.TemporaryDirectory(prefix="bench_audit_") as tmp:
        meta = write_imagenet_meta(Path(tmp) / "meta.txt", args.lines)
        datasets = {mode: RankDataset(meta, rank=0, world_size=1, audit=mode) for mode in ("warn", "off")}
        # A pass is running on each (as under a DataLoader without workers): the rank counts its reads.
        passes = [iter(RandomSampler(ds)) for ds in datasets.values()]
        for running in passes:
            next(running)
        n = args.lines
        # Random indices, as RandomSampler hands out, the same for both.
        order = np.random.default_rng(0).permutation(n)[: min(n, 200_000)].tolist()
        cases: dict[str, tuple[int, Callable[[Any], Callable[[], Any]]]] = {
            "ds[i]": (len(order), lambda ds: lambda: [ds[i] for i in order]),
        }
        for b in BATCHES:
            batches = [order[j : j + b] for j in range(0, len(order), b)]
            cases[f"ds.__getitems__(batch of {b})"] = (
                len(batches),
                lambda ds, bs=batches: lambda: [ds.__getitems__(x) for x in bs],
            )
        per_call: dict[str, dict[str, list[float]]] = {case: {"warn": [], "off": []} for case in cases}
        for _ in range(args.rounds):
            for case, (calls, make) in cases.items():
                for mode in ("warn", "off", "off", "warn")[:: 1 if _ % 2 else -1]:  # alternate the order
                    per_call[case][mode].append(seconds(make(datasets[mode])) / calls * 1e9)
        counted = datasets["warn"].audit()[-1].read
        # The count itself, called alone (per call, less an empty loop of as many rounds).
        tally_ns: dict[str, list[float]] = {"warn": [], "off": []}
        reps = range(200_000)
        for _ in range(args.rounds):
            empty = seconds(lambda: [None for _ in reps])
            for mode, ds in datasets.items():
                tally = ds.channel.tally
                tally_ns[mode].append((seconds(lambda t=tally: [t(256) for _ in reps]) - empty) / len(reps) * 1e9)
        for running in passes:
            running.close()
    rows = [
        f"# The pass audit's cost, N = {n:,} (random indices, {len(order):,} reads per measurement)",
        "",
    ]
    results: dict[str, dict[str, float]] = {}
    table = []
    for case, times in per_call.items():
        on, off = statistics.median(times["warn"]), statistics.median(times["off"])
        results[case] = {"on_ns": on, "off_ns": off, "added_ns": on - off, "ratio": on / off}
        table.append((case, f"{on:,.0f}", f"{off:,.0f}", f"{on - off:,.0f}", f"{on / off:.3f}"))
    header = ["access", "ns per call, audit counting", "ns per call, audit off", "added ns per call", "ratio"]
    rows += md_table(header, table, "lrrrr")
    whole = {mode: statistics.median(v) for mode, v in tally_ns.items()}
    results["the count alone: channel.tally(256)"] = {
        "on_ns": whole["warn"],
        "off_ns": whole["off"],
        "added_ns": whole["warn"] - whole["off"],
        "ratio": whole["warn"] / whole["off"],
    }
    rows.append(
        f"| the count alone: `channel.tally(256)`, the whole call | {whole['warn']:,.0f} | {whole['off']:,.0f} | "
        f"{whole['warn'] - whole['off']:,.0f} | {whole['warn'] / whole['off']:.3f} |"
    )
    rows += [
        "",
        f'Medians over {args.rounds} rounds, each reading both datasets twice in alternating order. With audit="off" '
        "the count is skipped after one comparison, so the added time is the count's store in the control block "
        "(not the call that checks it); the last row times the whole call, the audit's entire cost per batch "
        f"(with audit off, the call and one comparison). The counting dataset counted {counted:,} reads.",
        "",
        f"Command: `python benchmarks/bench_audit.py --lines {n} --rounds {args.rounds}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "audit", rows, results, lambda path: _plot(results, path))
    return 0


def _plot(results: dict[str, dict[str, float]], path: Path) -> None:
    plt = plotting()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = list(results)
    ax.barh(names[::-1], [results[k]["added_ns"] for k in names[::-1]])
    ax.set_xlabel("ns added per call by the pass audit")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
