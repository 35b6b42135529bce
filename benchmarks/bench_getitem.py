"""Item access in one process: RankDataset beside a plain Python list of str, and the parsers' cost;
and reads from the meta file itself: ``mf[i]`` and ``MetaFile.read`` of 256 random indices beside
256 consecutive ones (what a sampler's batch costs the meta server, with every check of the file).

Usage:
    python benchmarks/bench_getitem.py                     # N = 1M lines, W = 1
    python benchmarks/bench_getitem.py --lines 20000 --out /tmp/results
"""

from __future__ import annotations

import argparse
import json
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


class ListDataset:
    """The naive loader's dataset: a list of str behind __getitem__."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __getitem__(self, i: int) -> str:
        return self.lines[i]


def rate(fn: Callable[[], Any], items: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return items / best


def file_reads(meta: Path, n: int, rounds: int = 7, calls: int = 100) -> dict[str, float]:
    """Microseconds a call of ``mf[i]`` (random i), ``mf.read`` of 256 consecutive and of 256 random
    indices: medians over ``rounds`` alternating rounds of ``calls`` calls each."""
    import numpy as np

    from rank_dataset import MetaFile

    mf = MetaFile(meta)
    rng = np.random.default_rng(0)
    batch = min(256, n)
    times: dict[str, list[float]] = {"mf[i]": [], "consecutive": [], "random": []}
    for _ in range(rounds):
        consecutive = [np.arange(a, a + batch) for a in rng.integers(0, n - batch + 1, calls).tolist()]
        randoms = [rng.integers(0, n, batch) for _ in range(calls)]
        for name, batches in (("consecutive", consecutive), ("random", randoms)):
            start = time.perf_counter()
            for indices in batches:
                mf.read(indices)
            times[name].append((time.perf_counter() - start) / calls * 1e6)
        singles = rng.integers(0, n, calls * 10).tolist()
        start = time.perf_counter()
        for i in singles:
            mf[i]
        times["mf[i]"].append((time.perf_counter() - start) / len(singles) * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from rank_dataset import RankDataset

    with tempfile.TemporaryDirectory(prefix="bench_getitem_") as tmp:
        work = Path(tmp)
        meta = write_imagenet_meta(work / "meta.txt", args.lines)
        jsonl = work / "meta.jsonl"
        with open(meta) as src, open(jsonl, "w") as dst:
            for line in src:
                path, label = line.split()
                dst.write(json.dumps({"path": path, "label": int(label)}) + "\n")
        n = args.lines
        lines = meta.read_text().splitlines()
        order = list(range(0, n, 7)) + list(range(3, n, 7))  # a scattered order, the same for all
        k = len(order)
        plain, listed = lines, ListDataset(lines)
        ds = RankDataset(meta, rank=0, world_size=1)
        labels = RankDataset(meta, rank=0, world_size=1, parser="label")
        jsons = RankDataset(jsonl, rank=0, world_size=1, parser="json")
        rates = {
            "plain list: lines[i]": rate(lambda: [plain[i] for i in order], k),
            "list-backed Dataset: ds[i]": rate(lambda: [listed[i] for i in order], k),
            "RankDataset: ds[i]": rate(lambda: [ds[i] for i in order], k),
            "RankDataset: ds.__getitems__(batch of 256)": rate(
                lambda: [ds.__getitems__(order[j : j + 256]) for j in range(0, k, 256)], k
            ),
            'RankDataset, parser="label": ds[i]': rate(lambda: [labels[i] for i in order], k),
            'RankDataset, parser="json": ds[i]': rate(lambda: [jsons[i] for i in order], k),
        }
        reads = file_reads(meta, n)
    base_list, base_ds = rates["plain list: lines[i]"], rates["list-backed Dataset: ds[i]"]
    ours = rates["RankDataset: ds[i]"]
    rows = [
        f"# Item access in one process, N = {n:,}",
        "",
        *md_table(
            ["access", "items/s", "ns/item", "vs plain list", "vs list-backed Dataset"],
            [
                (name, f"{r:,.0f}", f"{1e9 / r:,.0f}", f"{r / base_list:.2f}", f"{r / base_ds:.2f}")
                for name, r in rates.items()
            ],
            "lrrrr",
        ),
    ]
    label_cost = 1e9 / rates['RankDataset, parser="label": ds[i]'] - 1e9 / ours
    json_cost = 1e9 / rates['RankDataset, parser="json": ds[i]'] - 1e9 / ours
    rows += [
        "",
        f'Parser cost per sample: "label" {label_cost:,.0f} ns, "json" {json_cost:,.0f} ns '
        "(beyond the plain str item; the JSON lines are longer).",
        "Best of 3 passes over the same scattered order of every 7th item.",
        "",
        f"## Reads from the meta file (N = {n:,}, its index cached)",
        "",
        "| call | µs per call | vs 256 consecutive |",
        "|---|---:|---:|",
        f"| MetaFile.read of 256 consecutive indices | {reads['consecutive']:,.0f} | 1.00x |",
        f"| MetaFile.read of 256 random indices | {reads['random']:,.0f} |"
        f" {reads['random'] / reads['consecutive']:.2f}x |",
        f"| mf[i], random i | {reads['mf[i]']:,.1f} | |",
        "",
        "Medians over 7 alternating rounds of 100 calls each (1,000 for mf[i]); every call opens the file and",
        "its index cache, checks that neither changed and checks each line against the bytes read. A read of",
        "fewer than 4,096 rows takes their index entries from the process's map of the index cache (touched",
        "pages stay mapped: the first rounds pay the page faults); every line is one positional read.",
        "",
        f"Command: `python benchmarks/bench_getitem.py --lines {n}`",
        "",
        machine_info(),
    ]
    data = {**rates, "file reads (us per call)": reads}
    save_results(args.out, "getitem", rows, data, lambda path: _plot(rates, path))
    return 0


def _plot(rates: dict[str, float], path: Path) -> None:
    plt = plotting()

    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(rates)
    ax.barh(names[::-1], [rates[k] / 1e6 for k in names[::-1]])
    ax.set_xlabel("million items/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
